"""GGUF architectures -> mlx-vlm text model classes: config from metadata, tensor names to parameters."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gmlx_plan.families import GEMMA, LLAMA, QWEN
from gmlx_plan.geometry import DEFAULT_CONTEXT, GEMMA3_PATTERN, GEMMA3_WINDOW, head_dims
from gmlx_plan.geometry import vocab_size as vocab_size
from gmlx_plan.gguf_header import GGUFHeader
from gmlx_server.engine.vlm_adapter import config_class, language_model_class, own_caches


class UnsupportedArchitecture(ValueError):
    def __init__(self, path: str, arch: str) -> None:
        super().__init__(f"{path}: unsupported architecture {arch!r} (supported: {', '.join(sorted(ARCHS))})")


# GGUF per-layer tensor suffix -> HF parameter suffix shared by the llama-like families.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 has four norms per block; GGUF's ffn_norm is the pre-feed-forward one there.
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLK = re.compile(r"^blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")


@dataclass(frozen=True)
class ArchSpec:
    family: str  # selects intents and fallback chat templates
    module: str  # mlx_vlm.models.<module>.language
    build_config: Callable[[GGUFHeader, int], dict[str, Any]]
    layer_names: dict[str, str]
    # Gemma GGUFs store RMSNorm weights as (1 + w); mlx-vlm's Gemma norm adds the 1 itself.
    norm_offset: float = 0.0

    def model_class(self) -> Any:
        return language_model_class(self.module)

    def make_config(self, params: dict[str, Any]) -> Any:
        return config_class(self.module).from_dict(params)

    def hf_name(self, gguf_name: str) -> str | None:
        """HF parameter name for a GGUF tensor, or None for tensors the class has no slot for."""
        m = _BLK.match(gguf_name)
        if m:
            part = self.layer_names.get(m.group(2))
            return f"model.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None
        stem, _, kind = gguf_name.rpartition(".")
        base = _GLOBAL_NAMES.get(stem)
        return f"{base}.{kind}" if base else None


def _common(h: GGUFHeader, vocab: int) -> dict[str, Any]:
    """The config keys every family shares; head sizes and windows as the planner's geometry reads them."""
    heads = int(h.arch_value("attention.head_count"))
    hidden = int(h.arch_value("embedding_length"))
    return {
        "hidden_size": hidden,
        "num_hidden_layers": int(h.arch_value("block_count")),
        "intermediate_size": int(h.arch_value("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(h.arch_value("attention.head_count_kv", heads)),
        "rms_norm_eps": float(h.arch_value("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": vocab,
        "max_position_embeddings": int(h.arch_value("context_length", DEFAULT_CONTEXT)),
        "head_dim": head_dims(h, hidden, heads)[0],
        "tie_word_embeddings": not any(t.name == "output.weight" for t in h.tensors),
    }


def _rope_scaling(h: GGUFHeader) -> dict[str, Any] | None:
    kind = h.arch_value("rope.scaling.type")
    factor = h.arch_value("rope.scaling.factor")
    if not kind or kind == "none" or not factor:
        return None
    out: dict[str, Any] = {"type": str(kind), "rope_type": str(kind), "factor": float(factor)}
    orig = h.arch_value("rope.scaling.original_context_length")
    if orig:
        out["original_max_position_embeddings"] = int(orig)
    return out


def _llama_config(h: GGUFHeader, vocab: int) -> dict[str, Any]:
    c = _common(h, vocab)
    # llama.cpp's converter permutes Q/K rows for llama; traditional (interleaved) RoPE undoes it.
    return c | {"model_type": "llama", "rope_theta": float(h.arch_value("rope.freq_base", 10000.0)),
                "rope_traditional": True, "rope_scaling": _rope_scaling(h)}


def _qwen2_config(h: GGUFHeader, vocab: int) -> dict[str, Any]:
    c = _common(h, vocab)
    c.pop("head_dim")
    return c | {"model_type": "qwen2", "rope_theta": float(h.arch_value("rope.freq_base", 1e6)),
                "rope_scaling": _rope_scaling(h)}


def _qwen3_config(h: GGUFHeader, vocab: int) -> dict[str, Any]:
    return _common(h, vocab) | {"model_type": "qwen3", "rope_theta": float(h.arch_value("rope.freq_base", 1e6)),
                                "rope_scaling": _rope_scaling(h)}


def _gemma3_config(h: GGUFHeader, vocab: int) -> dict[str, Any]:
    c = _common(h, vocab)
    c.pop("tie_word_embeddings")
    # llama.cpp scales queries by 1/sqrt(head_dim), except the 27B model (62 layers): hidden/heads.
    scalar = c["hidden_size"] // c["num_attention_heads"] if c["num_hidden_layers"] == 62 else c["head_dim"]
    return c | {
        "model_type": "gemma3_text",
        "rope_global_base_freq": float(h.arch_value("rope.freq_base", 1e6)),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": float(scalar),
        "sliding_window": int(h.arch_value("attention.sliding_window", GEMMA3_WINDOW)),
        "sliding_window_pattern": int(h.arch_value("attention.sliding_window_pattern", GEMMA3_PATTERN)),
        "rope_scaling": _rope_scaling(h),
    }


ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec(LLAMA.name, "llama", _llama_config, _LAYER_NAMES),
    "qwen2": ArchSpec(QWEN.name, "qwen2", _qwen2_config, _LAYER_NAMES),
    "qwen3": ArchSpec(QWEN.name, "qwen3", _qwen3_config, _LAYER_NAMES),
    "gemma3": ArchSpec(GEMMA.name, "gemma3", _gemma3_config, _GEMMA3_LAYER_NAMES, norm_offset=-1.0),
}


def arch_spec(header: GGUFHeader) -> ArchSpec:
    spec = ARCHS.get(header.architecture)
    if spec is None:
        raise UnsupportedArchitecture(header.path, header.architecture)
    return spec


def make_cache(model: Any) -> list[Any]:
    """The model's own per-layer caches; qwen2/qwen3's text classes have no make_cache: plain KV caches."""
    own = own_caches(model)
    if own is not None:
        return own
    from mlx_vlm.models.cache import KVCache  # imported here: arch.py is read at boot without MLX

    return [KVCache() for _ in model.layers]
