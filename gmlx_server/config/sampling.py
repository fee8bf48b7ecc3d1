"""The sampling knobs, named once: each one's JSON kind and the range a request field or a profile key may take.

The request parsers (protocol/params.py), the profile checker (config/parse.py) and the OpenAPI document
(protocol/openapi_doc.py) read this table. What a knob defaults to is engine/types.py's SamplingParams (the
value that leaves the logits alone; a family's intents move some of them); a test keeps both name the same knobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

KnobKind = Literal["number", "integer", "boolean"]
_INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class Knob:
    kind: KnobKind
    lo: float = 0.0
    hi: float = 0.0
    lo_open: bool = False  # the value must be above lo (a zero repetition penalty divides by zero)

    def admits(self, v: float) -> bool:
        return (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi

    def range_text(self) -> str:
        if self.kind == "integer":
            return f"between {int(self.lo)} and {int(self.hi)}"
        return f"{'>' if self.lo_open else '>='} {self.lo} and <= {self.hi}"


# Ranges follow OpenAI where it defines one, else what is meaningful.
SAMPLING_KNOBS: Mapping[str, Knob] = MappingProxyType({
    "temperature": Knob("number", 0.0, 2.0),
    "top_p": Knob("number", 0.0, 1.0),
    "top_k": Knob("integer", -1, _INT_MAX),  # -1: off, as llama.cpp-style clients say it
    "min_p": Knob("number", 0.0, 1.0),
    "top_n_sigma": Knob("number", 0.0, 1e6),
    "p_less": Knob("boolean"),
    "typical_p": Knob("number", 0.0, 1.0),
    "repetition_penalty": Knob("number", 0.0, 10.0, lo_open=True),
    "presence_penalty": Knob("number", -2.0, 2.0),
    "frequency_penalty": Knob("number", -2.0, 2.0),
    "repetition_context_size": Knob("integer", 0, _INT_MAX),
    "presence_context_size": Knob("integer", 0, _INT_MAX),
    "frequency_context_size": Knob("integer", 0, _INT_MAX),
    "xtc_probability": Knob("number", 0.0, 1.0),
    "xtc_threshold": Knob("number", 0.0, 0.5),  # mlx-vlm's XTC refuses more (past 0.5 at most one token is above it)
    "seed": Knob("integer", -(2**63), 2**64 - 1),  # -1: a fresh random seed; MLX keys take it modulo 2**64
})
