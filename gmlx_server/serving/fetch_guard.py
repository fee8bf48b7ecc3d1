"""The guard on every outbound fetch a request can cause: only public addresses, unless the operator allows more.

A URL's host is resolved once, every address it resolves to is checked against the non-public classes, and the
fetch connects to the address that was checked, so DNS rebinding cannot swap it between check and connect.
Literal spellings (decimal, octal, hex, short IPv4; IPv4-mapped, NAT64, 6to4 and Teredo IPv6) are read the way
the C resolver reads them, so none slips past as a name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> the address strings it resolves to
ALLOW_HINT = "server.image_fetch_allow_private or server.image_fetch_allowed_hosts allows it"

_V4_RULES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"), ("127.0.0.0/8", "loopback"), ("10.0.0.0/8", "private (RFC 1918)"),
    ("172.16.0.0/12", "private (RFC 1918)"), ("192.168.0.0/16", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT"), ("169.254.0.0/16", "link-local"), ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"), ("240.0.0.0/4", "reserved"),
)
_V6_RULES: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"), ("::1/128", "loopback"), ("fc00::/7", "unique-local"), ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"), ("ff00::/8", "multicast"), ("64:ff9b:1::/48", "local-use NAT64"),
)
_NETS = tuple((ipaddress.ip_network(net), rule) for net, rule in _V4_RULES + _V6_RULES)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_V4_COMPAT = ipaddress.ip_network("::/96")
_V4_LITERAL = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}", re.IGNORECASE)


class FetchRefused(Exception):
    """The URL's host is not one a request may make gmlx contact; `rule` says why ("a loopback address")."""

    def __init__(self, rule: str) -> None:
        self.rule = rule
        super().__init__(rule)


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 form carries, and the form's name."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    if ip.teredo is not None:
        return ip.teredo[1], "Teredo"
    if ip in _V4_COMPAT and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip)), "IPv4-compatible"
    return None


def refusal(ip: Address) -> str | None:
    """The non-public class `ip` falls in (a rule's name), or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            rule = refusal(inner[0])
            return f"{rule} (as {inner[1]} IPv6)" if rule else None
    for net, rule in _NETS:
        if ip.version == net.version and ip in net:
            return rule
    return None if ip.is_global else "reserved (not globally routable)"


def literal(host: str) -> Address | None:
    """An IP address written as the host, in any spelling the C resolver accepts (0x7f.1, 017700000001,
    2130706433, [::ffff:127.0.0.1]); None for a name."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _V4_LITERAL.fullmatch(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            raise FetchRefused("a malformed IPv4 literal") from None
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class FetchGuard:
    """What the operator allows beyond public addresses: everything (allow_private), or named hosts and
    networks (server.image_fetch_allowed_hosts)."""

    allow_private: bool = False
    hosts: frozenset[str] = frozenset()  # host names, lower case, without a trailing dot
    networks: tuple[Network, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False)

    @classmethod
    def of(cls, allow_private: bool, allowed: Iterable[str], resolver: Resolver = system_resolver) -> FetchGuard:
        names, nets = split_allowed(allowed)
        return cls(allow_private, names, nets, resolver)

    async def address(self, host: str, port: int) -> str:
        """The address to connect to for `host`, checked; FetchRefused naming the rule otherwise."""
        name = host.lower().rstrip(".")
        ip = literal(name)
        if ip is not None:
            return str(self._checked(ip, name))
        try:
            found = [ipaddress.ip_address(a.split("%")[0]) for a in await self.resolver(name, port)]
        except (OSError, ValueError):
            raise FetchRefused("a name that does not resolve") from None
        if not found:
            raise FetchRefused("a name that does not resolve")
        checked = [self._checked(a, name) for a in found]  # every address, not just the one connected to
        return str(checked[0])

    def _checked(self, ip: Address, name: str) -> Address:
        rule = refusal(ip)
        if rule is None or self.allow_private or name in self.hosts or any(ip in n for n in self.networks):
            return ip
        raise FetchRefused(f"{'an' if rule[0] in 'aeiou' else 'a'} {rule} address")


def split_allowed(items: Iterable[str]) -> tuple[frozenset[str], tuple[Network, ...]]:
    """Allowed-host entries -> (names, networks): an IP address or CIDR network, else a host name."""
    names: set[str] = set()
    nets: list[Network] = []
    for item in items:
        try:
            nets.append(ipaddress.ip_network(item.strip("[]"), strict=False))
        except ValueError:
            names.add(item.lower().rstrip("."))
    return frozenset(names), tuple(nets)
