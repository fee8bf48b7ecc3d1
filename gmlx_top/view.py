"""Pure formatting of a /v1/metrics snapshot for `gmlx top` (no Textual, no I/O).

Every field may be null (a failed probe nulls its section's live fields, a server may lack the
capacity table), so each formatter takes loose JSON and answers "-" for what is missing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DASH = "-"
BAND_STYLE = {"green": "bold black on #3fb950", "yellow": "bold black on #e3b341",
              "orange": "bold black on #f0883e", "red": "bold white on #da3633"}
STATE_STYLE = {"queued": "yellow", "prefill": "cyan", "decode": "green"}
REQUEST_COLUMNS = ("id", "model", "key", "state", "pos", "prompt", "gen/max", "tok/s", "ttft", "elapsed",
                   "cache", "spec")
MODEL_COLUMNS = ("model", "flags", "expires", "in flight", "waiting", "weights", "active", "prompt cache",
                 "profile")
HOST_COLUMNS = ("host", "state", "band", "queue", "decoding", "decode tok/s", "prefill tok/s", "rejected", "eta")


def section(server: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = server.get(name)
    return value if isinstance(value, Mapping) else {}


def rows(server: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    value = server.get(name)
    return [r for r in value if isinstance(r, Mapping)] if isinstance(value, list) else []


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def num(value: Any, digits: int = 1, unit: str = "") -> str:
    if not _is_num(value):
        return DASH
    text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return text + unit


def size(value: Any) -> str:
    """Bytes in binary units: 1536 -> 1.5K, 98_000_000 -> 93.5M."""
    if not _is_num(value):
        return DASH
    amount = float(value)
    for unit in ("B", "K", "M", "G"):
        if abs(amount) < 1024:
            return f"{amount:.0f}{unit}" if unit == "B" else f"{amount:.1f}{unit}"
        amount /= 1024
    return f"{amount:.1f}T"


def accept_rate(spec: Any) -> str:
    if not isinstance(spec, Mapping):
        return DASH
    rate = spec.get("accept_rate")
    if not _is_num(rate) and _is_num(spec.get("drafted")) and spec["drafted"]:
        rate = (spec.get("accepted") or 0) / spec["drafted"]
    return f"{rate:.0%}" if _is_num(rate) else DASH


def cache_tier(cache: Any) -> str:
    if not isinstance(cache, Mapping) or not cache.get("tier"):
        return DASH
    warm = cache.get("warm_tokens")
    return f"{cache['tier']} {warm}" if _is_num(warm) and warm else str(cache["tier"])


BAR_CELLS = 6


def position_cell(row: Mapping[str, Any]) -> str:
    """A queued row's place in line; a prefilling row's progress bar, share done and ETA (`███░░░ 52% 8.1s`)."""
    done, total, eta = row.get("position"), row.get("prompt_tokens"), row.get("prefill_eta_s")
    if row.get("state") != "prefill" or not (isinstance(done, int) and isinstance(total, int) and total > 0):
        return num(done)
    frac = min(1.0, max(0.0, done / total))
    filled = round(frac * BAR_CELLS)
    bar = "█" * filled + "░" * (BAR_CELLS - filled) + f" {frac:.0%}"
    return f"{bar} {num(eta, 1, 's')}" if _is_num(eta) else bar


def request_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    gen, cap = row.get("generated"), row.get("max_tokens")
    return (str(row.get("id") or DASH)[-12:], str(row.get("model") or DASH), str(row.get("key") or DASH),
            str(row.get("state") or DASH),
            position_cell(row), num(row.get("prompt_tokens")), f"{num(gen)}/{num(cap)}",
            num(row.get("decode_tok_s")), num(row.get("ttft_s"), 2, "s"), num(row.get("elapsed_s"), 1, "s"),
            cache_tier(row.get("cache")), accept_rate(row.get("speculative")))


def request_summary(requests: list[Mapping[str, Any]]) -> str:
    counts = {state: sum(1 for r in requests if r.get("state") == state) for state in STATE_STYLE}
    return f"requests {len(requests)}: " + "  ".join(f"{n} {state}" for state, n in counts.items())


def model_flags(row: Mapping[str, Any]) -> str:
    lifetime = row.get("lifetime")
    by_request = isinstance(lifetime, Mapping) and lifetime.get("source") == "request"
    flags = [name for name in ("pinned", "kept") if row.get(name)] + (["keep_alive"] if by_request else [])
    return " ".join(flags) or DASH


def expires(lifetime: Any) -> str:
    """What a resident model has left before the idle sweep unloads it (`8m43s`), or "never"."""
    if not isinstance(lifetime, Mapping):
        return DASH
    if "keep_alive_s" in lifetime and lifetime["keep_alive_s"] is None:
        return "never"  # pinned, kept, a keep_alive of -1, or no idle timeout
    left: Any = lifetime.get("expires_in_s")
    return duration(left) if _is_num(left) and math.isfinite(left) else DASH


def duration(seconds: float) -> str:
    """45s, 9m58s, 1h30m: a countdown at the precision that matters."""
    hours, rest = divmod(max(0, int(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def model_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    busy = f"{num(row.get('in_flight'))}/{num(row.get('decode_batch'))}"
    return (str(row.get("id") or DASH), model_flags(row), expires(row.get("lifetime")), busy, num(row.get("waiting")),
            size(row.get("weights_bytes")), size(row.get("active_bytes")), prompt_cache(row.get("prompt_cache")),
            str(row.get("profile") or DASH))


def prompt_cache(cache: Any) -> str:
    """RAM bytes/entries, then the disk tier's when it is on: `12.0M/3 disk 40.0M/2`."""
    if not isinstance(cache, Mapping):
        return DASH
    text = f"{size(cache.get('bytes'))}/{num(cache.get('entries'))}"
    disk = cache.get("disk")
    return text + (f" disk {size(disk.get('bytes'))}/{num(disk.get('entries'))}" if isinstance(disk, Mapping) else "")


def queue_line(server: Mapping[str, Any]) -> str:
    q, c = section(server, "queue"), section(server, "concurrency")
    last = q.get("last_reject_reason")
    text = (f"queue {num(q.get('waiting'))}/{num(q.get('cap'))} waiting  eta {num(q.get('eta_s'), 1, 's')}  "
            f"rejected {num(q.get('rejections'))}")
    text += f" (last: {last})" if last else ""
    return text + f"   decoding {num(c.get('in_flight'))}/{num(c.get('decode_batch'))}"


def services_line(server: Mapping[str, Any]) -> str:
    """One line for the services (embeddings, rerank, stt, tts): state, in flight/cap and counts; "" without any."""
    parts = []
    for kind, row in section(server, "services").items():
        if isinstance(row, Mapping):
            parts.append(f"{kind} {row.get('state') or DASH} {num(row.get('in_flight'))}/"
                         f"{num(row.get('max_concurrent'))} req {num(row.get('requests'))} "
                         f"err {num(row.get('errors'))} rej {num(row.get('rejections'))}")
    return "services: " + "  ".join(parts) if parts else ""


def host_cells(url: str, connection: str, server: Mapping[str, Any]) -> tuple[str, ...]:
    """One host of a fleet: where, whether it answers, its band, queue, decode slots, rates and rejections."""
    q, c, r = section(server, "queue"), section(server, "concurrency"), section(server, "rates")
    band = section(server, "governor").get("band")
    return (url.removeprefix("http://"), connection, str(band or DASH), f"{num(q.get('waiting'))}/{num(q.get('cap'))}",
            f"{num(c.get('in_flight'))}/{num(c.get('decode_batch'))}", num(r.get("decode_tok_s")),
            num(r.get("prefill_tok_s_recent")), num(q.get("rejections")), num(q.get("eta_s"), 1, "s"))


def fleet_line(servers: list[tuple[str, Mapping[str, Any]]]) -> str:
    """The fleet's totals over the hosts that answer: (connection, snapshot) per host."""
    live = [s for state, s in servers if state == "connected"]

    def total(name: str, key: str) -> float:
        values: list[Any] = [section(s, name).get(key) for s in live]
        return float(sum(v for v in values if _is_num(v)))

    return (f"fleet: {len(live)}/{len(servers)} hosts up  decoding {total('concurrency', 'in_flight'):g}/"
            f"{total('concurrency', 'decode_batch'):g}  waiting {total('queue', 'waiting'):g}  "
            f"decode {total('rates', 'decode_tok_s'):.1f} tok/s  rejected {total('queue', 'rejections'):g}")


def memory_line(server: Mapping[str, Any]) -> str:
    m = section(server, "memory")
    return (f"memory active {size(m.get('active_bytes'))}  cache {size(m.get('cache_bytes'))}  "
            f"headroom {size(m.get('headroom_bytes'))}  rss {size(m.get('rss_bytes'))}  "
            f"budget {size(m.get('budget_bytes'))}")


def governor_text(server: Mapping[str, Any]) -> tuple[str, str, str]:
    """(band label, its style, the rest of the line)."""
    g = section(server, "governor")
    band = g.get("band")
    label = f" {band or 'unknown'} "
    state = "off" if g.get("enabled") is False else "on"
    return label, BAND_STYLE.get(str(band), "reverse"), f" governor {state}  sheds {num(g.get('sheds'))}"


def rates_line(server: Mapping[str, Any]) -> tuple[str, str]:
    r = section(server, "rates")
    decode = (f"decode {num(r.get('decode_tok_s'))} tok/s over {num(r.get('decode_streams'))} streams  "
              f"recent {num(r.get('decode_tok_s_recent'))}  lifetime {num(r.get('decode_tok_s_lifetime'))}")
    prefill = f"prefill recent {num(r.get('prefill_tok_s_recent'))} tok/s"
    tokens = section(server, "tokens")  # absent from servers before it: the line stays as it was
    if tokens:
        prefill += f"   generated {num(tokens.get('generated'), 0)}, reasoning {num(tokens.get('reasoning'), 0)}"
    return decode, prefill


def capacity_lines(cap: Any) -> list[str]:
    """The boot table: max context by width beside max width by depth; one line when there is none."""
    if not isinstance(cap, Mapping):
        return ["no capacity table"]
    by_width, by_depth = (list(v.items()) if isinstance(v := cap.get(k), Mapping) else []
                          for k in ("max_ctx", "max_width_at_depth"))
    lines = [f"{cap.get('model') or DASH}  budget {size(cap.get('budget_bytes'))}", "width  max ctx   depth  width"]
    for i in range(max(len(by_width), len(by_depth))):
        left = f"{by_width[i][0]:>5}  {num(by_width[i][1]):>7}" if i < len(by_width) else " " * 14
        right = f"   {by_depth[i][0]:>5}  {num(by_depth[i][1]):>5}" if i < len(by_depth) else ""
        lines.append(left + right)
    return lines


class History:
    """Rates kept client-side for the sparklines (the server keeps no history).

    Each series starts full of zeros, so a sparkline fills in from the right at a zero baseline.
    """

    def __init__(self, length: int = 120) -> None:
        self.decode: deque[float] = deque([0.0] * length, maxlen=length)
        self.prefill: deque[float] = deque([0.0] * length, maxlen=length)

    def record(self, server: Mapping[str, Any]) -> None:
        r = section(server, "rates")
        for series, key in ((self.decode, "decode_tok_s"), (self.prefill, "prefill_tok_s_recent")):
            value = r.get(key)
            series.append(float(value) if isinstance(value, int | float) else 0.0)


@dataclass
class Backoff:
    """Reconnect delays: initial, doubling up to maximum; reset by a successful poll."""

    initial: float = 0.5
    maximum: float = 8.0
    attempts: int = 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * 2.0 ** self.attempts)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
