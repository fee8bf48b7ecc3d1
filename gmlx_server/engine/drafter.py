"""A speculative model's drafter: a second GGUF model, loaded beside its target on the engine thread, that
proposes `tokens` (k) tokens per round for the target to verify in one forward pass.

The drafter must share the target's token list (serving/model_files.py checks it at start and reload; the load checks
it again, since the file may have changed). Its KV caches stay unquantized whatever the target's kv_quant:
they are small, and gmlx_plan.memory budgets them so (with_draft); they hold the target's kv_dtype. Its weights
run in the layout its entry names (a configured id's `weights`, else auto), which is how a packed model drafts
for its dense self.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gmlx_plan.gguf_header import read_header, token_list_difference
from gmlx_server.config.settings import Draft
from gmlx_server.engine.arch import vocab_size
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.types import ModelInfo


class DrafterMismatch(ValueError):
    """The drafter's token list is not the target's: a file problem (the load answers 503 model_load_failed)."""


@dataclass(frozen=True)
class Drafter:
    loaded: LoadedModel  # the drafter's model, tokenizer and fresh-cache factory (unquantized KV)
    model_id: str  # the configured id its `draft:` named, else its file's stem
    tokens: int  # k: tokens proposed per round

    @property
    def model(self) -> Any:
        return self.loaded.model

    def make_cache(self) -> list[Any]:
        """A request's fresh drafter caches (one per layer)."""
        return self.loaded.make_cache()

    @property
    def weights_bytes(self) -> int:
        return self.loaded.info.weights_bytes

    @property
    def context_length(self) -> int:
        """The drafter's own window: a round past it would draft from positions it was not trained on."""
        return self.loaded.info.context_length

    @property
    def vocab(self) -> int:
        """The drafter's logits width (its embedding rows), which may pad past the shared token list."""
        return vocab_size(self.loaded.header)


def load_drafter(target: LoadedModel, draft: Draft, native_kernels: bool = True) -> Drafter:
    """Load `draft` for `target` (call it on the engine thread, after the target's load)."""
    # Both lists from the files, before loading any weights: the loaded target's header keeps only its length.
    problem = token_list_difference(read_header(draft.path), read_header(target.header.path))
    if problem is not None:
        raise DrafterMismatch(f"drafter {draft.path} cannot draft for {target.info.path}: the token lists "
                              f"differ: {problem}")
    loaded = load_gguf_model(draft.path, model_id=draft.model_id, layout=draft.weights,
                             native_kernels=native_kernels, kv_dtype=target.info.kv_dtype)  # as the planner counts
    return Drafter(loaded, draft.model_id, draft.tokens)


def with_drafter(info: ModelInfo, drafter: Drafter) -> ModelInfo:
    """The target's info as a speculative model reports it: it drafts (no request-level logits processors), and
    its weights are both models' (what the load gate and residency count)."""
    return replace(info, drafts=True, weights_bytes=info.weights_bytes + drafter.weights_bytes)
