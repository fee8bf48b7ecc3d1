"""The engine's interface: what the server submits and what comes back.

Pure data and a Protocol; nothing here touches MLX, so the server, the planner and
the fake engine used by fast tests all share these types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gmlx_plan.capacity import KVQuantReport
from gmlx_plan.memory import KVDtype, Layout

if TYPE_CHECKING:  # vision imports MLX; these types stay pure
    from gmlx_server.engine.vision.processor import ImageProcessor
    from gmlx_server.engine.vision.prompt import VisionPrompt

GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "grammar", "tool_call"]


@dataclass(frozen=True)
class CompiledGrammar:
    """A grammar checked by engine/structured.py (an output format, or tool calls); one GrammarConstraint each."""

    kind: GrammarKind
    schema: Mapping[str, Any] | None  # the JSON schema it enforces (None: a regex, choice or grammar)
    grammar: str  # llguidance's grammar text


FinishReason = Literal["stop", "length", "cancelled", "shed", "error"]
RequestState = Literal["queued", "prefill", "decode", "done"]


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling knob the protocols accept; defaults mean 'off'."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    top_n_sigma: float = 0.0
    p_less: bool = False
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    repetition_context_size: int = 20
    presence_penalty: float = 0.0
    presence_context_size: int = 20
    frequency_penalty: float = 0.0
    frequency_context_size: int = 20
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class ThinkingControl:
    """Where the model's thinking block starts/ends, and how many tokens it may spend there."""

    budget: int | None = None
    open_tag: str = "<think>"
    close_tag: str = "</think>"


@dataclass(frozen=True)
class GenerationRequest:
    """The engine's request: what the service submits once GenerationParams is tokenized."""

    request_id: str
    prompt_tokens: Sequence[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    top_logprobs: int = 0
    logprobs: bool = False
    thinking: ThinkingControl | None = None
    # True when the rendered prompt already opened a thinking block (template with enable_thinking).
    starts_in_thinking: bool = False
    grammar: CompiledGrammar | None = None  # an output format or tool calls, compiled before submit; masks tokens
    # Prompt-cache hints: token positions where messages end (checkpoints for sliding-window models)
    # and the length of a shared prefix (system + tools) to pin as an anchor.
    cache_boundaries: Sequence[int] = ()
    cache_anchor: int | None = None
    vision: VisionPrompt | None = None  # the prompt's images: tower inputs and their soft-token slots
    priority: int = 0  # the queue's order (lower first, then arrival) and the governor's shed order


@dataclass(frozen=True)
class SpeculativeStats:
    """A drafter's work: rounds run, tokens drafted, drafts the target kept. Immutable, so a stats() reader on
    another thread sees one round's counts or the next, never a mix: the engine thread replaces it per round."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    def plus(self, drafted: int, accepted: int, rounds: int = 1) -> SpeculativeStats:
        return SpeculativeStats(self.rounds + rounds, self.drafted + drafted, self.accepted + accepted)

    def __add__(self, other: SpeculativeStats) -> SpeculativeStats:
        return self.plus(other.drafted, other.accepted, other.rounds)

    @property
    def accept_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True)
class Timings:
    prompt_tokens: int
    generated: int
    prefill_s: float
    decode_s: float
    ttft_s: float | None
    cached_tokens: int = 0  # prompt tokens restored from the prompt cache instead of prefilled
    speculative: SpeculativeStats | None = None  # the request's drafting; None without a drafter
    # The prompt tokens run through the model, [start, end) with their seconds (chunk by chunk; the decode
    # steps of other rows between chunks are not in them), and the seconds the cached tokens took to restore.
    spans: tuple[tuple[int, int, float], ...] = ()
    restore_s: float = 0.0
    cache_tier: str = "miss"  # where the cached tokens came from: a RAM tier, "disk", or "miss"

    @property
    def computed_tokens(self) -> int:
        return sum(e - b for b, e, _ in self.spans)

    @property
    def computed_s(self) -> float:
        return sum(s for _, _, s in self.spans)

    @property
    def prefill_tok_s(self) -> float:
        """Computed tokens over the seconds they took: a cache hit's restored tokens are no prefill."""
        s = self.computed_s
        return self.computed_tokens / s if s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first token comes from prefill; decode speed counts the tokens after it.
        n = max(self.generated - 1, 0)
        return n / self.decode_s if self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class TokenEvent:
    """One generated token (or the final event). `text` may be empty while UTF-8 is incomplete."""

    text: str
    token_id: int | None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    finish_reason: FinishReason | None = None
    stop_string: str | None = None
    error: str | None = None
    timings: Timings | None = None


@dataclass(frozen=True)
class RequestRow:
    """A live request as the metrics snapshot shows it."""

    request_id: str
    state: RequestState
    prompt_tokens: int
    generated: int
    max_tokens: int
    elapsed_s: float
    ttft_s: float | None
    decode_tok_s: float | None
    cache_tier: str = "miss"  # exact, block, ckpt, anchor or miss
    warm_tokens: int = 0
    speculative: SpeculativeStats | None = None  # its drafting so far; None without a drafter
    priority: int = 0
    prefilled: int = 0  # prompt tokens already in its cache (restored or computed): its prefill's progress
    expected_warm: int = 0  # queued: the warm tokens it should restore once it starts (the drain replay's)


@dataclass(frozen=True)
class EngineStats:
    decode_batch: int
    in_flight: int
    waiting: int
    rows: tuple[RequestRow, ...] = ()
    step_s: Mapping[int, float] = field(default_factory=dict)  # measured decode step seconds by batch width
    join_s: float | None = None  # what the step after a row joins the batch adds (merging its cache)
    step_ctx: Mapping[int, float] = field(default_factory=dict)  # the batch's KV tokens those steps ran at
    step_s_per_ctx: float = 0.0  # a step's added seconds per KV token beyond them
    leave_s: float | None = None  # what the step after a row leaves the batch adds (filtering its caches)


class EngineClosed(RuntimeError):
    """submit() to an engine that is closed or whose thread died: refuse instead of hanging."""


class RequestHandle(Protocol):
    """What `Engine.submit` returns: iterate it on the event loop that submitted it."""

    request_id: str

    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...

    def cancel(self) -> None: ...


@dataclass
class MemorySnapshot:
    """MLX allocator figures, refreshed by the engine thread (other threads must not call MLX)."""

    active_bytes: int = 0
    cache_bytes: int = 0
    peak_bytes: int = 0


@dataclass(frozen=True)
class PromptCacheStats:
    """A prompt cache's counters as its engine last published them; `enabled` False without one."""

    enabled: bool = False
    max_bytes: int = 0
    bytes: int = 0
    entries: int = 0
    pinned: int = 0
    pinned_bytes: int = 0
    hits: Mapping[str, int] = field(default_factory=dict)  # by tier: exact, block, ckpt, anchor
    misses: int = 0
    tokens_reused: int = 0
    evictions: int = 0
    stores: int = 0
    rejected: int = 0
    block_tokens: int = 0
    disk: Mapping[str, Any] | None = None  # the disk tier's counters for this model; None when it is off


class Engine(Protocol):
    """One resident model. Real engines do all MLX work on one thread of their own. Every member is required
    (check_engine); engine/base.py's EngineBase gives the optional capabilities honest defaults."""

    info: ModelInfo
    tokenizer: Tokenizer
    template: ChatTemplate
    memory: MemorySnapshot | None  # None: the engine cannot measure its memory

    def submit(self, request: GenerationRequest) -> RequestHandle: ...

    def generate_sync(self, request: GenerationRequest, on_event: Callable[[TokenEvent], None]) -> None:
        """Blocking generation (the CLI): every event, the final one included, goes to `on_event`."""

    def stats(self) -> EngineStats: ...

    def cache_stats(self) -> PromptCacheStats: ...

    def cache_peek(self, prompt_tokens: Sequence[int]) -> tuple[str, int]:
        """The tier and warm tokens a request with this prompt would get now, without counting a hit."""

    def expected_warm(self, prompt_tokens: Sequence[int]) -> int:
        """The warm tokens a request with this prompt sent now should restore when its prefill starts: the cache's
        now, or the prefix it shares with a live request (cached by then): the time estimates' warm split."""

    def reset_cache(self) -> bool:
        """Empty the prompt cache (between steps); False when there is none."""

    def shed(self, request_id: str, reason: str) -> bool:
        """End a running request with finish_reason "shed"; False when the engine cannot or it is gone."""

    @property
    def fault(self) -> str | None:
        """None while the engine serves; why it stopped otherwise (the host then restarts it)."""

    def close(self) -> None:
        """Stop; afterwards every submitted request has had its final event."""


def _protocol_members(protocol: type) -> tuple[str, ...]:
    """A Protocol's own members, in declaration order: what a structural check must find."""
    own = vars(protocol)
    names = [*own.get("__annotations__", {}), *own]
    return tuple(dict.fromkeys(n for n in names if not n.startswith("_")))


ENGINE_MEMBERS = _protocol_members(Engine)  # derived, so a member added to Engine is checked at once


def check_engine(engine: object) -> None:
    """Refuse, at construction, an engine that lacks part of the contract instead of degrading later."""
    missing = [name for name in ENGINE_MEMBERS if not hasattr(engine, name)]
    if missing:
        raise TypeError(f"{type(engine).__name__} is not a complete engine: it lacks {', '.join(missing)}")


class Tokenizer(Protocol):
    """Text <-> token ids, built from GGUF metadata alone: the one description the engine (detokenizer,
    grammars, sampler) and the service (context checks, tool grammars) read."""

    vocab_size: int
    bos_id: int | None
    eos_ids: frozenset[int]
    add_bos: bool
    special_ids: frozenset[int]  # control tokens: never text, skipped when decoding for a reader
    strip_leading_space: bool  # SentencePiece's decoder drops the first piece's leading space
    max_token_chars: int | None  # the longest piece in characters, where bounded (byte-level BPE)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...


class ChatTemplate(Protocol):
    """A model's chat template, rendered the way transformers' apply_chat_template does."""

    source: str  # "gguf", "config", or "family:<name>" for a fallback template
    text: str  # the Jinja source (tool-call syntax is inferred from it)
    variables: frozenset[str]  # undeclared variables the template reads (enable_thinking, tools, ...)

    def render(
        self,
        messages: Sequence[Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None = None,
        add_generation_prompt: bool = True,
        **variables: object,
    ) -> str: ...


@dataclass(frozen=True)
class ModelInfo:
    """What the server needs to know about a loaded model, without touching MLX."""

    model_id: str
    path: str
    architecture: str
    family: str  # llama, qwen, gemma, ... (selects intents and fallback templates)
    context_length: int
    trained_context_length: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    sliding_window: int | None
    weights_layout: Layout | Literal["mlx"]  # what loaded: a GGUF layout, or mlx (a model dir's own weights)
    weights_bytes: int
    load_s: float
    tensor_types: Mapping[str, str] = field(default_factory=dict)  # GGUF type -> what it became
    drafts: bool = False  # a speculative drafter verifies tokens in bulk: no per-request logits processors
    kv_quant: KVQuantReport | None = None  # the quantized KV caches really built, per layer (None: not configured)
    kv_dtype: KVDtype = "float32"  # what the unquantized KV caches hold (kv_dtype resolved at load)
    vision: ImageProcessor | None = None  # a vision model's image preprocessing (None: text only)
