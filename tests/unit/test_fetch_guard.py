"""The fetch guard over address literals: every non-public class is refused in every spelling the C resolver
reads (dotted, decimal, octal, hex, short IPv4; IPv4-mapped, NAT64, 6to4 and IPv4-compatible IPv6), public
addresses pass, and the operator's allowances open exactly what they name."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmlx_server.serving.fetch_guard import FetchGuard, FetchRefused, literal, refusal

V4 = ipaddress.IPv4Address
NON_PUBLIC_V4 = ["0.0.0.0/8", "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                 "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4"]
# IPv6 ranges that carry an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo): checked by the one they carry
CARRIERS = [ipaddress.ip_network(n) for n in (
    "::ffff:0:0/96", "::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32")]
NON_PUBLIC_V6 = ["::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "::/128", "64:ff9b:1::/48"]


def public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast  # Python's is_global counts some multicast as global


def in_network(cidr: str) -> st.SearchStrategy[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    net = ipaddress.ip_network(cidr)
    return st.integers(0, net.num_addresses - 1).map(lambda i: ipaddress.ip_address(int(net.network_address) + i))


def spellings(ip: ipaddress.IPv4Address) -> list[str]:
    """One address as the C resolver accepts it: dotted, one number (decimal, hex, octal), per-part octal and hex,
    the short a.b form, and the IPv6 forms that carry it."""
    n, parts = int(ip), [int(p) for p in str(ip).split(".")]
    hx = f"{n:08x}"
    return [str(ip), str(n), hex(n), "0" + oct(n)[2:], ".".join(f"0{p:o}" for p in parts),
            ".".join(hex(p) for p in parts), f"{parts[0]}.{n & 0xFFFFFF}", f"[::ffff:{ip}]",
            f"[::ffff:{hx[:4]}:{hx[4:]}]", f"[64:ff9b::{ip}]", f"[2002:{hx[:4]}:{hx[4:]}::]"]


def address(guard: FetchGuard, host: str) -> str:
    return asyncio.run(guard.address(host, 80))


@given(st.one_of(*(in_network(n) for n in NON_PUBLIC_V4)), st.data())
def test_non_public_v4_is_refused_in_every_spelling(ip: ipaddress.IPv4Address, data: st.DataObject) -> None:
    assert refusal(ip) is not None
    spelled = data.draw(st.sampled_from(spellings(ip)))
    parsed = literal(spelled)
    assert parsed is not None and refusal(parsed) is not None, spelled
    with pytest.raises(FetchRefused):
        address(FetchGuard(), spelled)


@given(st.one_of(*(in_network(n) for n in NON_PUBLIC_V6)))
def test_non_public_v6_is_refused(ip: ipaddress.IPv6Address) -> None:
    with pytest.raises(FetchRefused):
        address(FetchGuard(), f"[{ip}]")


@given(st.ip_addresses(v=4).filter(public), st.data())
def test_public_v4_passes_in_every_spelling(ip: ipaddress.IPv4Address, data: st.DataObject) -> None:
    spelled = data.draw(st.sampled_from(spellings(ip)))
    assert refusal(ip) is None
    parsed = literal(spelled)
    assert parsed == ip or (isinstance(parsed, ipaddress.IPv6Address) and spelled.startswith("["))
    assert address(FetchGuard(), spelled) == str(parsed)


@given(st.ip_addresses(v=6).filter(lambda ip: public(ip) and not any(ip in n for n in CARRIERS)))
def test_public_v6_passes(ip: ipaddress.IPv6Address) -> None:
    assert address(FetchGuard(), f"[{ip}]") == str(ip)


@pytest.mark.parametrize("host, rule", [
    ("127.0.0.1", "loopback"), ("0x7f.1", "loopback"), ("2130706433", "loopback"), ("0177.0.0.1", "loopback"),
    ("10.1.2.3", "private (RFC 1918)"), ("100.64.0.1", "carrier-grade NAT"), ("169.254.169.254", "link-local"),
    ("[fd00::1]", "unique-local"), ("[fe80::1]", "link-local"), ("[::ffff:10.0.0.1]", "private (RFC 1918) (as "
                                                                                       "IPv4-mapped IPv6)"),
    ("[64:ff9b::a9fe:a9fe]", "link-local (as NAT64 IPv6)"), ("0.0.0.0", "unspecified"), ("[::]", "unspecified"),
    ("239.1.1.1", "multicast"), ("192.0.2.1", "reserved (not globally routable)"),
], ids=["loopback", "hex", "decimal", "octal", "rfc1918", "cgnat", "metadata", "ula", "v6-link-local", "mapped",
        "nat64", "unspecified", "v6-unspecified", "multicast", "reserved"])
def test_the_refusal_names_the_rule(host: str, rule: str) -> None:
    with pytest.raises(FetchRefused) as e:
        address(FetchGuard(), host)
    assert e.value.rule == f"{'an' if rule[0] == 'u' else 'a'} {rule} address"


def stub(table: dict[str, list[str]]) -> Callable[[str, int], asyncio.Future[list[str]]]:
    async def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("no such host")
        return table[host]
    return resolve  # type: ignore[return-value]


def test_names_are_checked_by_every_address_they_resolve_to() -> None:
    guard = FetchGuard.of(False, [], stub({"cdn.example": ["93.184.216.34"], "rebind.example": ["127.0.0.1"],
                                           "mixed.example": ["93.184.216.34", "10.0.0.7"]}))
    assert address(guard, "cdn.example") == "93.184.216.34"
    for host in ("rebind.example", "mixed.example"):
        with pytest.raises(FetchRefused, match=r"loopback|RFC 1918"):
            address(guard, host)
    with pytest.raises(FetchRefused, match="does not resolve"):
        address(guard, "nowhere.example")


def test_allowances_open_what_they_name_and_no_more() -> None:
    table = {"imgs.lan": ["10.0.0.5"], "other.lan": ["10.0.0.6"], "db.lan": ["192.168.1.9"]}
    guard = FetchGuard.of(False, ["IMGS.lan.", "192.168.1.0/24", "127.0.0.1"], stub(table))
    assert address(guard, "imgs.lan") == "10.0.0.5"
    assert address(guard, "db.lan") == "192.168.1.9"  # by its network
    assert address(guard, "127.0.0.1") == "127.0.0.1"
    for host in ("other.lan", "127.0.0.2", "[::1]"):
        with pytest.raises(FetchRefused):
            address(guard, host)
    assert address(FetchGuard.of(True, [], stub(table)), "other.lan") == "10.0.0.6"
