"""A request's image parts -> decoded images: data URIs taken as sent, http(s) URLs fetched under limits.

Fetching is a server reaching out on a client's word, so it is bounded: http(s) only, redirects followed
by hand (at most MAX_REDIRECTS, each again http(s)), one deadline for the whole fetch, a byte cap checked
against Content-Length and while reading, an image content type, and `server.image_fetch: false` to turn
it off (data URIs still work). Every hop's host passes the fetch guard (serving/fetch_guard.py: public
addresses only unless the operator allows more) and is connected at the address the guard checked. Every
fetch is logged with its size and time. Each failure is a 400 whose `param` names the part and whose
message names the URL; a refusal names the guard's rule and nothing the target said.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import ImageRef
from gmlx_server.serving.fetch_guard import ALLOW_HINT, FetchGuard, FetchRefused

if TYPE_CHECKING:
    from gmlx_server.config import ServerSettings

log = logging.getLogger("gmlx.images")
MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}
MAX_REDIRECTS = 3
MAX_PIXELS = 64_000_000  # a decoded image's width x height: past this, a few KB of PNG could take gigabytes
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class ImagePolicy:
    fetch: bool = True
    timeout_s: float = 10.0
    max_bytes: int = 20 * 1024 * 1024
    guard: FetchGuard = field(default_factory=FetchGuard)

    @classmethod
    def of(cls, s: ServerSettings) -> ImagePolicy:
        guard = FetchGuard.of(s.image_fetch_allow_private, s.image_fetch_allowed_hosts)
        return cls(s.image_fetch, s.image_fetch_timeout_s, s.image_max_bytes, guard)


def image_error(ref: ImageRef, what: str, code: str) -> InvalidRequest:
    return InvalidRequest(f"'{ref.param}': {what}", param=ref.param, code=code)


def _too_large(ref: ImageRef, size: str, policy: ImagePolicy) -> InvalidRequest:
    return image_error(ref, f"the image is {size}, over the limit of {policy.max_bytes} bytes "
                            "(server.image_max_bytes)", "image_too_large")


async def image_bytes(ref: ImageRef, policy: ImagePolicy) -> tuple[bytes, str | None]:
    """The image's bytes and declared media type: inline data, or a fetch."""
    if ref.data is not None:
        if len(ref.data) > policy.max_bytes:
            raise _too_large(ref, f"{len(ref.data)} bytes", policy)
        return ref.data, ref.media_type
    assert ref.url is not None
    if not policy.fetch:
        raise image_error(ref, f"this server does not fetch image URLs (server.image_fetch: false): {ref.url}; "
                               "send the image as a base64 data: URI", "image_fetch_disabled")
    return await fetch(ref, ref.url, policy)


async def fetch(ref: ImageRef, url: str, policy: ImagePolicy) -> tuple[bytes, str]:
    start, outcome = time.perf_counter(), "failed"
    try:
        async with asyncio.timeout(policy.timeout_s):
            data, media, final = await _get(ref, url, policy)
        outcome = f"{len(data)} bytes of {media}" + (f" (from {final})" if final != url else "")
        return data, media
    except TimeoutError:
        outcome = "timed out"
        raise image_error(ref, f"fetching {url} took longer than {policy.timeout_s:g} s "
                               "(server.image_fetch_timeout_s)", "image_fetch_failed") from None
    except (httpx.InvalidURL, ValueError) as e:
        outcome = f"failed (not a valid URL: {e})"
        raise image_error(ref, f"{url} is not a URL gmlx can fetch ({e})", "image_fetch_failed") from None
    except httpx.HTTPError as e:
        outcome = f"failed ({type(e).__name__}: {e})"
        raise image_error(ref, f"fetching {url} failed: {type(e).__name__}: {e}", "image_fetch_failed") from None
    except FetchRefused as e:
        outcome = f"refused by the fetch guard ({e.rule})"
        raise image_error(ref, f"fetching {url} was refused: {e.rule}; this server fetches images from public "
                               f"addresses only ({ALLOW_HINT})", "image_fetch_refused") from None
    except InvalidRequest as e:
        outcome = f"refused ({e.code})"
        raise
    finally:  # every fetch, refused or not, with its size (or failure) and time
        log.info("image fetch %s: %s in %.3f s", url, outcome, time.perf_counter() - start)


async def _get(ref: ImageRef, url: str, policy: ImagePolicy) -> tuple[bytes, str, str]:
    at = url
    async with httpx.AsyncClient(follow_redirects=False, timeout=policy.timeout_s, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            target, headers, extensions = await _pinned(at, at != url, policy.guard)
            async with client.stream("GET", target, headers=headers, extensions=extensions) as r:
                if r.is_redirect:
                    at = _redirect(ref, url, at, r.headers.get("location", ""))
                    continue
                if r.status_code != 200:
                    raise image_error(ref, f"fetching {url} answered HTTP {r.status_code}", "image_fetch_failed")
                media = r.headers.get("content-type", "").split(";")[0].strip().lower()
                if media not in MEDIA_TYPES:
                    raise image_error(ref, f"{url} is {media or 'untyped'}, not an image gmlx reads "
                                           f"({', '.join(MEDIA_TYPES)})", "unsupported_image_type")
                return await _body(ref, r, at, policy), media, at
    raise image_error(ref, f"fetching {url} redirected more than {MAX_REDIRECTS} times", "image_fetch_failed")


async def _pinned(url: str, hop: bool, guard: FetchGuard) -> tuple[httpx.URL, dict[str, str], dict[str, str]]:
    """`url` aimed at the address the guard checked for its host; the name stays in Host and TLS's SNI. One
    parser (urlsplit) reads the host for the check and the target, so no two readings of the URL can differ."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or DEFAULT_PORTS[parts.scheme.lower()]  # ValueError: bad port
    try:
        address = ipaddress.ip_address(await guard.address(host, port))
    except FetchRefused as e:
        raise FetchRefused(f"{'a redirect led to' if hop else 'its host is'} {e.rule}") from None
    at = f"[{address}]" if address.version == 6 else str(address)
    target = httpx.URL(urlunsplit((parts.scheme, f"{at}:{port}", parts.path or "/", parts.query, "")))
    headers = {"Accept": ", ".join(MEDIA_TYPES), "Host": parts.netloc.rpartition("@")[2]}
    return target, headers, {"sni_hostname": host} if parts.scheme.lower() == "https" else {}


def _redirect(ref: ImageRef, url: str, at: str, location: str) -> str:
    nxt = urljoin(at, location)
    if nxt.split(":", 1)[0].lower() not in ("http", "https"):
        raise image_error(ref, f"fetching {url} redirected to {nxt}: only http(s) is fetched", "image_fetch_failed")
    return nxt


async def _body(ref: ImageRef, r: httpx.Response, at: str, policy: ImagePolicy) -> bytes:
    length = r.headers.get("content-length", "")
    if length.isdigit() and int(length) > policy.max_bytes:
        raise _too_large(ref, f"{int(length)} bytes (Content-Length of {at})", policy)
    buf = bytearray()
    async for chunk in r.aiter_bytes():
        buf += chunk
        if len(buf) > policy.max_bytes:
            raise _too_large(ref, f"more than {policy.max_bytes} bytes (read from {at})", policy)
    return bytes(buf)


def decode(ref: ImageRef, data: bytes, media_type: str | None) -> Any:
    """The bytes as an RGB PIL image; a 400 naming the part for a type gmlx does not read or bytes that are
    not an image."""
    from PIL import Image, UnidentifiedImageError

    if media_type and media_type not in MEDIA_TYPES:
        raise image_error(ref, f"media type {media_type} is not an image gmlx reads ({', '.join(MEDIA_TYPES)})",
                          "unsupported_image_type")
    try:
        img = Image.open(io.BytesIO(data))
        if img.format not in MEDIA_TYPES.values():
            raise image_error(ref, f"the data is a {img.format} image, which gmlx does not read "
                                   f"({', '.join(MEDIA_TYPES)})", "unsupported_image_type")
        if img.width * img.height > MAX_PIXELS:
            raise image_error(ref, f"the image is {img.width}x{img.height} pixels, over the {MAX_PIXELS} a decoded "
                                   "image may hold", "image_too_large")
        img.load()
        return img.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise image_error(ref, f"the data is not a decodable image ({type(e).__name__}: {e})",
                          "invalid_image_data") from None
