"""Convert a faster-whisper (CTranslate2) Whisper directory into an MLX Whisper directory that mlx-audio loads:
config.json in MLX dimensions, weights.safetensors under mlx-audio's names, the tokenizer with Whisper's
timestamp tokens, the feature extractor's settings and the alignment heads. Test tooling: no MLX Whisper model
ships in a package reachable here, so the MLX backend is tested on the packaged tiny.en weights, converted.

    python -m tests.auxiliary.ct2_to_mlx CT2_DIR OUT_DIR
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import numpy as np

# CTranslate2's DataType ids (include/ctranslate2/types.h), in the order the enum declares them.
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
N_FFT, HOP, RATE, CHUNK_S = 400, 160, 16_000, 30


def read_ct2(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """model.bin: version, spec name, revision, then (name, rank, dims, dtype id, byte count, bytes) per variable,
    then (alias, target) pairs; aliases come back as the arrays they name."""
    buf, pos = path.read_bytes(), 0

    def take(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return int(value)

    def string() -> str:
        nonlocal pos
        n = take("H")  # the length counts the trailing NUL
        text = buf[pos:pos + n - 1].decode()
        pos += n
        return text

    version = take("I")
    if version < 5:
        raise ValueError(f"{path}: CTranslate2 binary version {version} is older than this reader (5+)")
    spec = string()
    take("I")  # the spec's revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        kind, size = take("B"), take("I")
        if kind not in DTYPES:
            raise ValueError(f"{path}: variable {name} has data type {kind}, which this reader does not handle")
        variables[name] = np.frombuffer(buf, DTYPES[kind], size // np.dtype(DTYPES[kind]).itemsize,
                                        pos).reshape(shape)
        pos += size
    for _ in range(take("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    if pos != len(buf):
        raise ValueError(f"{path}: {len(buf) - pos} bytes left after the last variable")
    return spec, variables


def weight(v: dict[str, np.ndarray], name: str) -> np.ndarray:
    """A float weight; an int8 one is scaled back (CTranslate2 stores int8 rows with a per-row weight_scale)."""
    w = v[name + "/weight"]
    if w.dtype == np.int8:
        return (w.astype(np.float32) / v[name + "/weight_scale"].reshape(-1, 1)).astype(np.float16)
    return w


def linear(v: dict[str, np.ndarray], src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[dst + ".weight"] = weight(v, src)
    if src + "/bias" in v:
        out[dst + ".bias"] = v[src + "/bias"]


def fused(v: dict[str, np.ndarray], src: str, dsts: list[str], out: dict[str, np.ndarray]) -> None:
    """Split a fused projection (q|k|v or k|v) into its parts; Whisper's key has no bias (CT2 stores zeros)."""
    parts = np.split(weight(v, src), len(dsts))
    biases = np.split(v[src + "/bias"], len(dsts))
    for dst, w, b in zip(dsts, parts, biases, strict=True):
        out[dst + ".weight"] = w
        if dst.endswith(".key"):
            if np.any(b):
                raise ValueError(f"{src}: the key's bias is not zero; Whisper's key projection has none")
        else:
            out[dst + ".bias"] = b


def norm(v: dict[str, np.ndarray], src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[dst + ".weight"], out[dst + ".bias"] = v[src + "/gamma"], v[src + "/beta"]


def block(v: dict[str, np.ndarray], src: str, dst: str, out: dict[str, np.ndarray], cross: bool) -> None:
    norm(v, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln", out)
    fused(v, f"{src}/self_attention/linear_0", [f"{dst}.attn.{p}" for p in ("query", "key", "value")], out)
    linear(v, f"{src}/self_attention/linear_1", f"{dst}.attn.out", out)
    if cross:
        norm(v, f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln", out)
        linear(v, f"{src}/attention/linear_0", f"{dst}.cross_attn.query", out)
        fused(v, f"{src}/attention/linear_1", [f"{dst}.cross_attn.{p}" for p in ("key", "value")], out)
        linear(v, f"{src}/attention/linear_2", f"{dst}.cross_attn.out", out)
    norm(v, f"{src}/ffn/layer_norm", f"{dst}.mlp_ln", out)
    linear(v, f"{src}/ffn/linear_0", f"{dst}.mlp1", out)
    linear(v, f"{src}/ffn/linear_1", f"{dst}.mlp2", out)


def layers(v: dict[str, np.ndarray], side: str) -> int:
    return len({k.split("/")[1] for k in v if re.match(side + r"/layer_\d+/", k)})


def mlx_weights(v: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, int | str]]:
    """mlx-audio's Whisper names (the MLX layout: Conv1d weights as out x kernel x in) and its dimensions."""
    out: dict[str, np.ndarray] = {}
    for i in (1, 2):  # CTranslate2 keeps PyTorch's out x in x kernel
        out[f"encoder.conv{i}.weight"] = weight(v, f"encoder/conv{i}").transpose(0, 2, 1)
        out[f"encoder.conv{i}.bias"] = v[f"encoder/conv{i}/bias"]
    n_enc, n_dec = layers(v, "encoder"), layers(v, "decoder")
    for i in range(n_enc):
        block(v, f"encoder/layer_{i}", f"encoder.blocks.{i}", out, cross=False)
    for i in range(n_dec):
        block(v, f"decoder/layer_{i}", f"decoder.blocks.{i}", out, cross=True)
    norm(v, "encoder/layer_norm", "encoder.ln_post", out)
    norm(v, "decoder/layer_norm", "decoder.ln", out)
    out["decoder.token_embedding.weight"] = weight(v, "decoder/embeddings")
    out["decoder.positional_embedding"] = v["decoder/position_encodings/encodings"]
    vocab, state = out["decoder.token_embedding.weight"].shape
    dims: dict[str, int | str] = {
        "model_type": "whisper", "n_mels": int(v["encoder/conv1/weight"].shape[1]),
        "n_audio_ctx": int(v["encoder/position_encodings/encodings"].shape[0]),
        "n_audio_state": int(out["encoder.ln_post.weight"].shape[0]), "n_audio_head": int(v["encoder/num_heads"]),
        "n_audio_layer": n_enc, "n_vocab": int(vocab),
        "n_text_ctx": int(out["decoder.positional_embedding"].shape[0]), "n_text_state": int(state),
        "n_text_head": int(v["decoder/num_heads"]), "n_text_layer": n_dec}
    return out, dims


def tokenizer_with_timestamps(src: Path, vocabulary: list[str]) -> dict[str, object]:
    """faster-whisper's tokenizer.json stops at <|notimestamps|>; Whisper's timestamp tokens (<|0.00|> ...)
    follow it in the vocabulary, and mlx-audio's decoder looks them up by name."""
    tok = json.loads(src.read_text())
    added = tok["added_tokens"]
    known = {a["content"] for a in added} | set(tok["model"]["vocab"])
    for i, piece in enumerate(vocabulary):
        if piece not in known:
            added.append({"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": False})
    return dict(tok)


def convert(ct2: Path, out: Path) -> Path:
    spec, variables = read_ct2(ct2 / "model.bin")
    if spec != "WhisperSpec":
        raise ValueError(f"{ct2} holds a {spec}, not a Whisper model")
    weights, dims = mlx_weights(variables)
    meta = json.loads((ct2 / "config.json").read_text())
    vocabulary = (ct2 / "vocabulary.txt").read_text(encoding="utf-8").split("\n")[: int(dims["n_vocab"])]
    out.mkdir(parents=True, exist_ok=True)
    import mlx.core as mx

    mx.save_safetensors(str(out / "weights.safetensors"), {k: mx.array(np.ascontiguousarray(a))
                                                           for k, a in weights.items()})
    (out / "config.json").write_text(json.dumps(dims, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"alignment_heads": meta["alignment_heads"]}))
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_with_timestamps(ct2 / "tokenizer.json", vocabulary)))
    eot = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "bos_token": eot, "eos_token": eot, "unk_token": eot,
        "pad_token": eot, "model_max_length": int(dims["n_text_ctx"])}))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": dims["n_mels"], "n_fft": N_FFT,
        "hop_length": HOP, "sampling_rate": RATE, "chunk_length": CHUNK_S, "n_samples": RATE * CHUNK_S,
        "nb_max_frames": RATE * CHUNK_S // HOP, "padding_side": "right", "padding_value": 0.0,
        "return_attention_mask": False, "processor_class": "WhisperProcessor"}))
    return out


if __name__ == "__main__":
    print(convert(Path(sys.argv[1]), Path(sys.argv[2])))
