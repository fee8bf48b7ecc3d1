"""Which browser origins and Host names a server accepts: parsing and matching, no HTTP framework.

config.py validates `server.allowed_origins` / `server.allowed_hosts` (and their env vars) with these;
routes/guard.py enforces them per request.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Loopback pages are served by local processes, which can reach the server anyway; a DNS-rebinding page
# keeps its own origin (http://evil.example:PORT), so allowing these opens nothing to remote sites.
LOOPBACK_ORIGINS = tuple(f"{scheme}://{host}:*" for scheme in ("http", "https")
                         for host in ("localhost", "127.0.0.1", "[::1]"))
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://(\[[0-9a-f:.]+\]|[^\s/:\[\]*]+)(?::(\d{1,5}|\*))?")
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")


def _split_origin(text: str) -> tuple[str, str, str] | None:
    """(scheme, host, port or '' or '*') of `scheme://host[:port]`, lowercased; None if malformed."""
    m = _ORIGIN.fullmatch(text.strip().lower())
    return None if m is None else (m.group(1), m.group(2), m.group(3) or "")


def check_origin_pattern(raw: str) -> str:
    """A normalized allowlist entry: '*', 'null' or scheme://host[:port|:*]; ValueError says why not."""
    text = raw.strip().lower()
    if text in ("*", "null"):
        return text
    if text.endswith("/") and text.count("/") == 3:
        text = text[:-1]  # "http://host:3000/" names the same origin; browsers never send the slash
    parts = _split_origin(text)
    if parts is None:
        raise ValueError(f"expected '*', 'null' or scheme://host[:port] (port may be *), got {raw[:200]!r}")
    return text


def check_host_name(raw: str) -> str:
    """A normalized Host allowlist entry: '*' or a DNS name / IP literal without a port."""
    text = raw.strip().lower()
    if text == "*" or _HOST_NAME.fullmatch(text) or _ip(text.strip("[]")) is not None:
        return text.rstrip(".")
    raise ValueError(f"expected a host name without scheme or port (or '*'), got {raw[:200]!r}")


def check_fetch_host(raw: str) -> str:
    """A normalized server.image_fetch_allowed_hosts entry: a DNS name, an IP address or a CIDR network."""
    text = raw.strip().lower()
    try:
        return str(ipaddress.ip_network(text.strip("[]"), strict=False))
    except ValueError:
        pass
    if text != "*" and _HOST_NAME.fullmatch(text):
        return text.rstrip(".")
    raise ValueError(f"expected a host name, an IP address or a network like 10.0.0.0/8, got {raw[:200]!r}")


def fetch_host_list(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(check_fetch_host(x) for x in items))


def origin_list(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(check_origin_pattern(x) for x in items))


def host_list(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(check_host_name(x) for x in items))


def split_list(raw: str) -> list[str]:
    """An env var's comma- or space-separated list."""
    return [item for item in re.split(r"[,\s]+", raw) if item]


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_loopback_address(addr: str) -> bool:
    """127.0.0.0/8, ::1 and IPv4-mapped loopback (a dual-stack socket's view of 127.0.0.1)."""
    ip = _ip(addr.strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and ip.is_loopback


def host_of(header: str) -> str:
    """The name in a Host header, without port, brackets' content kept as is, lowercased, no trailing dot."""
    text = header.strip().lower()
    if text.startswith("["):
        return text[: text.find("]") + 1] if "]" in text else text
    name, sep, port = text.rpartition(":")
    return (name if sep and port.isdigit() else text).rstrip(".")


@dataclass(frozen=True)
class OriginPolicy:
    """The loopback origins plus the configured patterns ('*' = any origin, 'null' = opaque origins)."""

    extra: tuple[str, ...] = ()

    def allows(self, origin: str) -> bool:
        text = origin.strip().lower()
        patterns = LOOPBACK_ORIGINS + self.extra
        if "*" in patterns or text in patterns:
            return True
        parts = _split_origin(text)
        if parts is None or parts[2] == "*":
            return False
        return any(_matches(p, parts) for p in patterns)


def _matches(pattern: str, origin: tuple[str, str, str]) -> bool:
    p = _split_origin(pattern)
    return p is not None and p[:2] == origin[:2] and p[2] in ("*", origin[2])


@dataclass(frozen=True)
class HostPolicy:
    """Host names a DNS-rebinding page cannot forge: IP literals, localhost, *.localhost, configured names.

    `always` checks every connection (a configured list); otherwise only loopback connections.
    """

    names: tuple[str, ...] = ()

    @property
    def always(self) -> bool:
        return bool(self.names) and "*" not in self.names

    def applies(self, local_addr: str | None) -> bool:
        if "*" in self.names:
            return False
        return self.always or (local_addr is not None and is_loopback_address(local_addr))

    def allows(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = host_of(header)
        if _ip(name.strip("[]")) is not None:  # an IP literal cannot be re-pointed by DNS
            return True
        return name == "localhost" or name.endswith(".localhost") or name in self.names

