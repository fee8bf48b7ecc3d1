"""What a speculative model's round can honour, decided before a request reaches the engine (pure, no MLX).

A round scores the drafter's k tokens with one target pass and keeps them by the acceptance rule over the two
models' final distributions. Temperature, top_p, top_k and min_p reshape each position's distribution alone,
so the drafter and the target apply them alike and the output keeps the target's distribution; a seed still
reproduces; stop strings and max_tokens act on the emitted text. Anything else that changes the logits is a
request-level logits processor the round cannot follow exactly: a grammar (its mask advances token by token),
logit_bias and the repetition, presence and frequency penalties (the drafter does not apply them), and the
other filters (top_n_sigma, p_less, typical_p, xtc). A request that sets one gets a 400 naming it; the
simplest rule that is exact. ROUND_SAMPLING is the one list to widen when the round learns more.
"""

from __future__ import annotations

from collections.abc import Callable

from gmlx_server.engine.types import SamplingParams

ROUND_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed")
# Every other knob, and when it is on (its "off" value leaves the logits as they are).
_ACTIVE: dict[str, Callable[[SamplingParams], bool]] = {
    "logit_bias": lambda p: bool(p.logit_bias),
    "repetition_penalty": lambda p: p.repetition_penalty != 1.0,
    "presence_penalty": lambda p: p.presence_penalty != 0.0,
    "frequency_penalty": lambda p: p.frequency_penalty != 0.0,
    "top_n_sigma": lambda p: p.top_n_sigma > 0.0,
    "p_less": lambda p: p.p_less,
    "typical_p": lambda p: 0.0 < p.typical_p < 1.0,
    "xtc_probability": lambda p: p.xtc_probability > 0.0,
}


def unsupported_sampling(params: SamplingParams) -> list[str]:
    """The sampling fields set that a speculative round cannot honour, in a fixed order."""
    return [name for name, on in _ACTIVE.items() if name not in ROUND_SAMPLING and on(params)]


def refusal(field: str, source: str) -> str:
    """Why a speculative model refuses `field` (set by `source`: the request, a profile, the family defaults)."""
    if field == "grammar":
        what = f"structured output ({source}) needs a request-level logits processor, a grammar"
    else:
        what = f"{field} (set by {source}) is a request-level logits processor"
    return (f"{what}, which a model with a speculative drafter cannot take: its rounds honour only "
            f"{', '.join(ROUND_SAMPLING)}, stop and max_tokens; drop it, or use a model without draft:")
