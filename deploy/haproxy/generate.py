"""Write an HAProxy configuration for several gmlx hosts (HAProxy 2.6+, Debian's `haproxy` package).

    python deploy/haproxy/generate.py --host gmlx1=10.0.0.11:8080 --host gmlx2=10.0.0.12:8080 > haproxy.cfg
    python deploy/haproxy/generate.py --check    # exit 1 when deploy/haproxy/haproxy.cfg is stale

The committed deploy/haproxy/haproxy.cfg is this script's output for three hosts on one machine; its
comments explain every setting. A generator rather than a template because the prompt-cache affinity
rules name each host (one rule per host, comparing its hash with every other host's).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "haproxy.cfg"
EXAMPLE = ("gmlx1=127.0.0.1:8081", "gmlx2=127.0.0.1:8082", "gmlx3=127.0.0.1:8083")
# The affinity key: the first of these request headers that is set, each what a client already sends
# (gmlx's own, Claude Code's, Codex's two spellings, the generic one); then a body's prompt_cache_key
# (OpenAI's) or metadata.user_id (Anthropic's, which Claude Code fills with its session id and sends
# to a local server instead of the header), then the caller's address.
KEY_HEADERS = ("X-Gmlx-Conversation", "X-Claude-Code-Session-Id", "session-id", "session_id", "X-Session-Id")
BODY_KEYS = ("prompt_cache_key", "metadata.user_id")
# One body for both protocols: OpenAI clients read error.{message,type,param,code}, Anthropic clients
# read type == "error" and error.{type,message}.
ERROR_BODY = ('{"type":"error","error":{"type":"%s","message":"%s","param":null,"code":"%s"}}')


@dataclass(frozen=True)
class Host:
    name: str
    address: str  # host:port


@dataclass(frozen=True)
class Fleet:
    hosts: tuple[Host, ...]
    bind: str = "127.0.0.1:8080"
    stats: str | None = "127.0.0.1:8404"
    key_headers: tuple[str, ...] = KEY_HEADERS
    body_key: bool = True  # a body's prompt_cache_key or metadata.user_id when no header is set
    address_key: bool = True  # the caller's address as the last resort
    inter_ms: int = 1000
    rise: int = 2
    fall: int = 3
    timeout_s: int = 600
    bufsize: int = 262144


def parse_host(text: str) -> Host:
    """NAME=HOST:PORT, or HOST:PORT named after its address (names must stay put: the affinity hash uses them)."""
    name, _, address = text.rpartition("=")
    if not re.fullmatch(r"[^\s:/]+:\d{1,5}", address):
        raise argparse.ArgumentTypeError(f"expected [NAME=]HOST:PORT, got {text!r}")
    name = name or "gmlx_" + re.sub(r"\W", "_", address)
    if not re.fullmatch(r"[A-Za-z][\w-]*", name):
        raise argparse.ArgumentTypeError(f"host name {name!r}: letters, digits, _ and - only")
    return Host(name, address)


def _error(status: int, kind: str, code: str, message: str, retry_after_s: int | None) -> str:
    body = ERROR_BODY % (kind, message, code)
    hdr = f" hdr Retry-After {retry_after_s}" if retry_after_s else ""
    return f"    http-error status {status} content-type application/json string '{body}'{hdr}"


def _global(f: Fleet) -> list[str]:
    return [
        "global",
        "    # One line per request on stdout (with -db, or under systemd/Kubernetes which collect it).",
        "    log stdout format raw local0 info",
        "    # A request is replayed on another host only if it fits in one buffer (retry-on below). 256 KiB",
        "    # holds an agent's request with its tools; a larger body is still forwarded, never retried.",
        f"    tune.bufsize {f.bufsize}",
        "    maxconn 2048",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    # Connects are local or LAN: fail fast, so a dead host's request is retried elsewhere at once.",
        "    timeout connect 2s",
        "    # Inactivity timeouts, longer than the longest prefill: a streamed answer is silent only until its",
        "    # first token (gmlx sends an SSE comment every 15 s meanwhile), a non-streamed one until it ends.",
        f"    timeout client {f.timeout_s}s",
        f"    timeout server {f.timeout_s}s",
        "    timeout http-request 30s",
        "    timeout http-keep-alive 30s",
        "    timeout check 2s",
        "    # HAProxy's own errors in the protocols' error shape: no host up at all, or none answered.",
        _error(503, "server_overloaded", "no_host_available", "no gmlx host can take a request now", 2),
        _error(502, "server_error", "bad_gateway", "the gmlx host failed before answering", None),
        _error(504, "server_error", "gateway_timeout", "the gmlx host did not answer in time", None),
        "",
    ]


def _frontend(f: Fleet) -> list[str]:
    return [
        "frontend gmlx",
        f"    bind {f.bind}",
        "    # The whole body is read before a host is picked: a request that a host refuses can then be",
        "    # replayed on another one, and a slow upload never holds a host's connection.",
        "    option http-buffer-request",
        "    # Authorization and x-api-key pass through untouched: each host checks the API key itself.",
        "    # Behind this proxy the hosts see its Host header: list public names in server.allowed_hosts.",
        "    default_backend gmlx",
        "",
    ]


def _key(f: Fleet) -> list[str]:
    """txn.key: the first affinity source a request carries (an empty header counts as none)."""
    sources = [(f"req.fhdr({h.lower()})", h) for h in f.key_headers]
    if f.body_key:
        sources += [(f"req.body,json_query('$.{k}')", f"the body's {k}") for k in BODY_KEYS]
    lines = []
    for i, (fetch, _) in enumerate(sources):
        unset = "!{ var(txn.key) -m found } " if i else ""
        lines.append(f"    http-request set-var(txn.key) {fetch} if {unset}{{ {fetch} -m len gt 0 }}")
    if f.address_key:
        lines.append('    http-request set-var-fmt(txn.key) "addr:%[src]" if !{ var(txn.key) -m found }')
    names = ", ".join(n for _, n in sources) + (", then the caller's address" if f.address_key else "")
    about = textwrap.wrap(f"The affinity key is the first of: {names}. Behind another proxy the caller's "
                          "address is that proxy's: set a header there." if f.address_key else
                          f"The affinity key is the first of: {names}.", 100)
    return [*(f"    # {line}" for line in about), *lines]


def _affinity(f: Fleet) -> list[str]:
    """Rendezvous (highest random weight) hashing: each host scores hash(key + host name); the top scorer
    is the conversation's home. Consistent: adding or removing a host moves only that host's keys."""
    lines = [
        "    # Prompt-cache affinity: a request carrying an affinity key goes to that conversation's home",
        "    # host, where its prefix is cached. The home is found by rendezvous hashing (each host scores",
        "    # xxh32(key@name), the highest wins), a consistent hash: adding or removing a host moves only",
        "    # the conversations of that host. A home that is not ready is skipped by use-server, so the",
        "    # request falls back to least connections, as does one without a key (with --no-address-key).",
        "    # (Hashing the first messages of the body instead would need no client change, but every",
        "    # conversation of one agent starts with the same system prompt: they would all share one home.)",
        *_key(f),
    ]
    for h in f.hosts:
        lines.append(f"    http-request set-var(txn.w_{h.name}) var(txn.key),concat(@{h.name}),xxh32 "
                     "if { var(txn.key) -m found }")
    for i, h in enumerate(f.hosts):
        # ties (never seen with 32-bit hashes) go to the host listed first
        beats = " ".join(f"{{ var(txn.w_{h.name}),sub(txn.w_{o.name}) {'ge' if j > i else 'gt'} 0 }}"
                         for j, o in enumerate(f.hosts) if o is not h)
        lines.append(f"    http-request set-var(txn.home) str({h.name}) if {{ var(txn.w_{h.name}) -m found }} "
                     f"{beats}".rstrip())
    none_ready = " ".join(f"!{{ srv_is_up(gmlx/{h.name}) }}" for h in f.hosts)
    lines += [
        "    use-server %[var(txn.home)] if { var(txn.home) -m found }",
        "    # No host ready at all: the home's overflow twin, so the cache still helps under load.",
        f"    use-server %[var(txn.home)]_spill if {{ var(txn.home) -m found }} {none_ready}",
    ]
    return lines


def _backend(f: Fleet) -> list[str]:
    inter = f"inter {f.inter_ms}ms fastinter {max(100, f.inter_ms // 2)}ms downinter {f.inter_ms * 2}ms"
    lines = [
        "backend gmlx",
        "    # Least connections: streams last seconds to minutes, so open connections measure a host's load",
        "    # better than a request count would.",
        "    balance leastconn",
        "    # Readiness: /health?ready=1 answers 503 while the host drains (SIGTERM), restarts an engine,",
        "    # is under memory pressure, has requests waiting or has every decode slot busy. A host that",
        f"    # fails {f.fall} checks in a row stops getting new work; {f.rise} good checks bring it back. Checks run",
        f"    # every {f.inter_ms} ms (faster while a state is changing), so a brief full batch between",
        "    # two requests does not flap a host out and back in. Running streams are never cut by a check.",
        "    option httpchk",
        "    http-check send meth GET uri /health?ready=1",
        "    http-check expect status 200",
        f"    default-server check {inter} rise {f.rise} fall {f.fall}",
        "    # A host's typed 503 (queue full, draining, engine restarting) comes before any byte of the",
        "    # answer, so the request is replayed on another host; so is a request a host closed without a",
        "    # response (killed), or could not take (connection refused). A stream that has started is never",
        "    # retried: retries only look at the response head, and response-timeout is left out (a long",
        "    # prefill must not be run twice). When every try is refused, the last host's 503 reaches the",
        "    # client with its own Retry-After (that host's drain estimate).",
        "    retry-on conn-failure empty-response 503",
        f"    retries {max(1, len(f.hosts) - 1)}",
        "    # Every retry goes to another host than the last one.",
        "    option redispatch 1",
        "    # Tokens go out as soon as a host sends them: no Nagle delay on SSE chunks (no compression here).",
        "    option http-no-delay",
        "    # A client that hangs up mid-stream closes the host's connection too, which cancels its request.",
        "    option abortonclose",
        "    # Which host answered, for clients and tests (the affinity key's home, or least connections').",
        "    http-response set-header X-Gmlx-Host %s",
        "    # When no host is ready, every live host still takes work up to its own queue cap: the _spill",
        "    # twins are backups (all used, least connections) whose check only asks that the host be up and",
        "    # not draining, restarting or pressured. Readiness steers; each host's admission decides.",
        "    option allbackups",
        *_affinity(f),
    ]
    for h in f.hosts:
        lines.append(f"    server {h.name} {h.address}")
    for h in f.hosts:
        lines.append(f"    server {h.name}_spill {h.address} backup no-check track spill/{h.name}")
    return [*lines, ""]


def _spill(f: Fleet) -> list[str]:
    lines = [
        "backend spill",
        "    # Checks only (no traffic): alive and accepting, even if busy or queueing. The _spill twins track it.",
        "    option httpchk",
        "    http-check send meth GET uri /health?ready=1",
        '    http-check expect rstring "\\"ready\\": ?true|\\"reason\\": ?\\"(queue|busy)\\""',
        f"    default-server check inter {f.inter_ms}ms rise 1 fall 2",
    ]
    lines += [f"    server {h.name} {h.address}" for h in f.hosts]
    return [*lines, ""]


def _stats(f: Fleet) -> list[str]:
    if f.stats is None:
        return []
    return [
        "frontend stats",
        f"    bind {f.stats}",
        "    # /stats (HTML, or ;csv): each host's check state, sessions and retries. /metrics: the same for",
        "    # Prometheus (HAProxy's built-in exporter).",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    stats enable",
        "    stats uri /stats",
        "    stats refresh 5s",
        "",
    ]


def render(f: Fleet) -> str:
    head = [
        "# HAProxy in front of several `gmlx serve` hosts. Generated by deploy/haproxy/generate.py:",
        f"#   python deploy/haproxy/generate.py {' '.join(f'--host {h.name}={h.address}' for h in f.hosts)}",
        "# README.md, \"Running several hosts\", explains the design and the measured figures.",
        "",
    ]
    return "\n".join(head + _global(f) + _frontend(f) + _backend(f) + _spill(f) + _stats(f))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Write an HAProxy config for several gmlx hosts.")
    p.add_argument("--host", action="append", type=parse_host, default=[], metavar="[NAME=]HOST:PORT",
                   help="a gmlx host (repeat); NAME keeps its affinity hash when its address changes")
    p.add_argument("--bind", default=Fleet.bind, help=f"where HAProxy listens (default {Fleet.bind})")
    p.add_argument("--stats", default=Fleet.stats, help="stats and /metrics listener, or 'none'")
    p.add_argument("--key-header", action="append", default=[], metavar="NAME",
                   help=f"an affinity header, in order (repeat; default {', '.join(KEY_HEADERS)})")
    p.add_argument("--no-body-key", action="store_true", help=f"do not read {' or '.join(BODY_KEYS)} from bodies")
    p.add_argument("--no-address-key", action="store_true",
                   help="key-less requests go by least connections instead of the caller's address")
    p.add_argument("--inter-ms", type=int, default=Fleet.inter_ms, help="health check interval")
    p.add_argument("--rise", type=int, default=Fleet.rise, help="good checks before a host takes work again")
    p.add_argument("--fall", type=int, default=Fleet.fall, help="failed checks before a host stops taking work")
    p.add_argument("--timeout-s", type=int, default=Fleet.timeout_s, help="client and server inactivity timeout")
    p.add_argument("--check", action="store_true", help="exit 1 when the committed haproxy.cfg is stale")
    return p


def fleet_of(args: argparse.Namespace) -> Fleet:
    hosts = tuple(args.host) or tuple(parse_host(h) for h in EXAMPLE)
    if len({h.name for h in hosts}) != len(hosts):
        raise SystemExit("generate.py: host names must be unique")
    stats = None if args.stats == "none" else args.stats
    return Fleet(hosts, args.bind, stats, tuple(args.key_header) or KEY_HEADERS, not args.no_body_key,
                 not args.no_address_key, args.inter_ms, args.rise, args.fall, args.timeout_s)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.check:
        stale = not COMMITTED.exists() or COMMITTED.read_text() != render(fleet_of(parser().parse_args([])))
        if stale:
            print("stale: deploy/haproxy/haproxy.cfg; run: python deploy/haproxy/generate.py > "
                  "deploy/haproxy/haproxy.cfg", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write(render(fleet_of(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
