"""A projector GGUF -> mlx-vlm's own vision tower and projector modules, weights mapped from llama.cpp's names.

Only the GGUF side is ours: the metadata -> config, and `v.*` / `mm.*` -> mlx-vlm's parameter names (the
inverse of llama.cpp's converter: conv kernels back to channels-last, Gemma's soft-embedding norm back to
its stored form). Two corrections bring mlx-vlm's SigLIP to the checkpoints' own arithmetic, as transformers
and llama.cpp compute it: the MLP's GELU is the tanh form (`gelu_pytorch_tanh`), and the post-layernorm takes
the configured epsilon (mlx-vlm builds it with the LayerNorm default).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine.gguf_tensors import LoadReport, load_gguf_tensors
from gmlx_server.engine.vision.mmproj import Projector

_LAYER = {"ln1": "layer_norm1", "ln2": "layer_norm2", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_out": "self_attn.out_proj", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}
_GLOBAL = {"v.patch_embd": "embeddings.patch_embedding", "v.position_embd": "embeddings.position_embedding",
           "v.post_ln": "post_layernorm"}
_PROJECTOR = {"gemma3": {"mm.input_projection.weight": "mm_input_projection_weight",
                         "mm.soft_emb_norm.weight": "mm_soft_emb_norm.weight"},
              "idefics3": {"mm.model.fc.weight": "modality_projection.proj.weight"}}
_BLK = re.compile(r"^v\.blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")


class VisionTower(nn.Module):
    """Images (N, C, H, W) -> soft-token features (N, tokens_per_tile, text hidden size). `modules`: a loaded
    mlx-vlm model's own (vision tower, projector), else new ones for the projector file's weights."""

    def __init__(self, p: Projector, modules: tuple[nn.Module, nn.Module] | None = None) -> None:
        super().__init__()
        self.family = p.family
        self.patch_size = p.patch_size
        self._encoder_prefix = "vision_model." if p.family == "gemma3" else ""
        self.vision, self.projector = modules or _modules(p)
        for layer in self._siglip().encoder.layers:
            layer.mlp.activation_fn = nn.GELU(approx="tanh")
        self._siglip().post_layernorm.eps = p.eps

    def _siglip(self) -> Any:
        return self.vision.vision_model if self.family == "gemma3" else self.vision

    def __call__(self, pixels: mx.array, pixel_mask: mx.array | None = None) -> mx.array:
        x = pixels.transpose(0, 2, 3, 1).astype(self.projector_dtype)  # channels-last, as MLX convolves
        if self.family == "gemma3":
            hidden, _, _ = self.vision(x)
            return self.projector(hidden)
        n, h, w = x.shape[:3]
        ps = self.patch_size
        patches = None
        if pixel_mask is not None:  # a patch counts when any of its pixels is real (not padding)
            patches = pixel_mask[:, : h // ps * ps, : w // ps * ps].reshape(n, h // ps, ps, w // ps, ps).any((2, 4))
        hidden, *_ = self.vision(x, patch_attention_mask=patches)
        return self.projector(hidden)

    @property
    def projector_dtype(self) -> mx.Dtype:
        return self._siglip().embeddings.patch_embedding.weight.dtype


def _modules(p: Projector) -> tuple[nn.Module, nn.Module]:
    vc = {"hidden_size": p.hidden_size, "intermediate_size": p.intermediate_size, "num_hidden_layers": p.layers,
          "num_attention_heads": p.heads, "patch_size": p.patch_size, "image_size": p.image_size,
          "layer_norm_eps": p.eps, "num_channels": 3}
    if p.family == "gemma3":
        from mlx_vlm.models.gemma3.config import VisionConfig as GemmaVision
        from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector
        from mlx_vlm.models.gemma3.vision import VisionModel as GemmaTower

        vision_config = GemmaVision(model_type="siglip_vision_model", **vc)
        tokens = (p.patches_per_side // p.scale_factor) ** 2
        text = SimpleNamespace(hidden_size=p.projection_dim, mm_tokens_per_image=tokens)
        cfg = SimpleNamespace(vision_config=vision_config, text_config=text)
        return GemmaTower(vision_config), Gemma3MultiModalProjector(cfg)
    from mlx_vlm.models.idefics3.config import VisionConfig as IdeficsVision
    from mlx_vlm.models.idefics3.idefics3 import Idefics3Connector
    from mlx_vlm.models.idefics3.vision import VisionModel as IdeficsTower

    vision_config = IdeficsVision(model_type="idefics3_vision", **vc)
    cfg = SimpleNamespace(vision_config=vision_config, text_config=SimpleNamespace(hidden_size=p.projection_dim),
                          scale_factor=p.scale_factor)
    return IdeficsTower(vision_config), Idefics3Connector(cfg)


def param_name(family: str, gguf_name: str, encoder_prefix: str) -> str | None:
    """mlx-vlm's parameter for a projector tensor, or None when the tower has no slot for it."""
    projector = _PROJECTOR[family].get(gguf_name)
    if projector is not None:
        return f"projector.{projector}"
    m = _BLK.match(gguf_name)
    if m:
        part = _LAYER.get(m.group(2))
        return f"vision.{encoder_prefix}encoder.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None
    stem, _, kind = gguf_name.rpartition(".")
    base = _GLOBAL.get(stem)
    return f"vision.{encoder_prefix}{base}.{kind}" if base else None


def load_tower(p: Projector, dtype: mx.Dtype = mx.float32) -> tuple[VisionTower, LoadReport]:
    """The projector file's tower with its weights (dense `dtype`; the towers are small beside the text model)."""
    from gmlx_plan.gguf_header import read_header

    header = read_header(p.path)
    tower = VisionTower(p)
    tensors, report = load_gguf_tensors(p.path, header.tensors, "dense", dense_dtype=dtype)
    weights: list[tuple[str, mx.array]] = []
    for name, t in tensors.items():
        target = param_name(p.family, name, tower._encoder_prefix)
        if target is None:
            raise ValueError(f"{p.path}: tensor {name} has no place in mlx-vlm's {p.family} vision tower")
        arr = t.arrays["weight"].astype(dtype)
        if name == "v.patch_embd.weight":
            arr = arr.transpose(0, 2, 3, 1)  # (out, in, kh, kw) as stored -> MLX's (out, kh, kw, in)
        elif name == "mm.soft_emb_norm.weight":
            arr = arr - 1.0  # the converter stores Gemma's (1 + w); mlx-vlm's RMSNorm adds the 1
        weights.append((target, arr))
    tower.load_weights(weights, strict=True)
    mx.eval(tower.parameters())
    return tower, report
