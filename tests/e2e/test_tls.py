"""TLS without a proxy: `gmlx serve --ssl-certfile/--ssl-keyfile` with a self-signed certificate made here; the
openai SDK trusting that certificate chats over HTTPS, a client that does not trust it is refused by the
handshake, plain HTTP to the port gets no answer, and one of the two files alone is a start-up error."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import ROOT, LiveServer, free_port, gmlx_serve

pytestmark = pytest.mark.slow


def self_signed(d: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    alt = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).add_extension(alt, critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(d)
    with gmlx_serve([smollm2_path(), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)], d,
                    tls_ca=str(cert)) as srv:
        yield srv, cert


def test_the_sdk_chats_over_https(tls_server: tuple[LiveServer, Path]) -> None:
    srv, cert = tls_server
    base = srv.base_url
    trust = ssl.create_default_context(cafile=str(cert))
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(verify=trust, timeout=120))
    r = client.chat.completions.create(model=Path(smollm2_path()).stem, max_tokens=4,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert r.choices[0].finish_reason in ("stop", "length")
    assert "listening on https://" in srv.log()
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(base + "/health", timeout=10)  # the system's trust store does not know this certificate
    with pytest.raises(httpx.HTTPError):
        httpx.get(base.replace("https://", "http://") + "/health", timeout=5)  # plain HTTP on the TLS port


def test_one_tls_file_alone_is_refused(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path)
    r = subprocess.run([sys.executable, "-m", "gmlx_server.cli", "serve", smollm2_path(), "--port",
                        str(free_port()), "--ssl-certfile", str(cert)], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--ssl-certfile and --ssl-keyfile go together" in r.stderr
