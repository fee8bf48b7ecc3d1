"""A tiny Qwen3-architecture GGUF that thinks: Qwen's tokenizer (Qwen2.5-Coder's, with Qwen3's four added
tokens in its padding slots), Qwen3's own chat template, and weights written so that each token's successor is
fixed (a bigram machine):

    the generation prompt's "\\n" -> <think> The user asks for the capital . </think> "\\n\\n" Paris <|im_end|>

The blocks' output projections are zero, so the residual stream is the current token's embedding: a one-hot
direction for each token of the chain, which the output matrix maps to its successor's logit. A prompt that
ends with "</think>\\n\\n" (thinking turned off) answers "Paris" alone; one that ends with "<think>" starts
inside the block. Everything else (loading, the template, tokenizing, sampling, streaming) is the real path.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

from tests.gguf_factory import FakeTensor, write_gguf

VERSION = 1  # bump when the file's recipe changes: the cached copy is rewritten
HIDDEN, HEADS, KV, HEAD_DIM, FFN = 64, 4, 2, 16, 64
ADDED = {151665: "<tool_response>", 151666: "</tool_response>", 151667: "<think>", 151668: "</think>"}
USER_DEFINED = 4
THOUGHT = ("The", "Ġuser", "Ġasks", "Ġfor", "Ġthe", "Ġcapital", ".")  # byte-level BPE: Ġ is a space
CHAIN = ("Ċ", "<think>", *THOUGHT, "</think>", "ĊĊ", "Paris", "<|im_end|>")
REASONING = "The user asks for the capital."
ANSWER = "Paris"
SCALE = 4.0  # the successor's logit is SCALE * sqrt(HIDDEN) = 32: greedy or sampled, the same token


def _tokenizer(qwen_gguf: str) -> tuple[dict[str, object], list[str]]:
    import gguf

    reader = gguf.GGUFReader(qwen_gguf)

    def strings(key: str) -> list[str]:
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    types_field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(types_field.parts[i][0]) for i in types_field.data]
    for index, text in ADDED.items():
        tokens[index], types[index] = text, USER_DEFINED
    meta: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": strings("tokenizer.ggml.merges"),
        "tokenizer.ggml.eos_token_id": 151645, "tokenizer.ggml.padding_token_id": 151643,
        "tokenizer.ggml.bos_token_id": 151643, "tokenizer.ggml.add_bos_token": False,
    }
    return meta, tokens


def _weights(tokens: list[str]) -> list[FakeTensor]:
    index = {t: i for i, t in enumerate(tokens)}
    ids = [index[t] for t in CHAIN]
    assert len(set(ids)) == len(ids) <= HIDDEN, "the chain's tokens must be distinct and fit the hidden size"
    embed = np.zeros((len(tokens), HIDDEN), np.float16)
    output = np.zeros((len(tokens), HIDDEN), np.float16)
    for k, (current, successor) in enumerate(itertools.pairwise(ids)):
        embed[current, k] = 1.0
        output[successor, k] = SCALE
    ones = np.ones(HIDDEN, np.float32)
    out = [FakeTensor("token_embd.weight", embed, QT.F16), FakeTensor("output.weight", output, QT.F16),
           FakeTensor("output_norm.weight", ones, QT.F32)]
    b = "blk.0."
    zero = np.zeros
    out += [FakeTensor(b + "attn_norm.weight", ones, QT.F32), FakeTensor(b + "ffn_norm.weight", ones, QT.F32),
            FakeTensor(b + "attn_q.weight", zero((HEADS * HEAD_DIM, HIDDEN), np.float32), QT.F32),
            FakeTensor(b + "attn_k.weight", zero((KV * HEAD_DIM, HIDDEN), np.float32), QT.F32),
            FakeTensor(b + "attn_v.weight", zero((KV * HEAD_DIM, HIDDEN), np.float32), QT.F32),
            FakeTensor(b + "attn_output.weight", zero((HIDDEN, HEADS * HEAD_DIM), np.float32), QT.F32),
            FakeTensor(b + "ffn_gate.weight", zero((FFN, HIDDEN), np.float32), QT.F32),
            FakeTensor(b + "ffn_up.weight", zero((FFN, HIDDEN), np.float32), QT.F32),
            FakeTensor(b + "ffn_down.weight", zero((HIDDEN, FFN), np.float32), QT.F32),
            FakeTensor(b + "attn_q_norm.weight", np.ones(HEAD_DIM, np.float32), QT.F32),
            FakeTensor(b + "attn_k_norm.weight", np.ones(HEAD_DIM, np.float32), QT.F32)]
    return out


def thinking_qwen3(qwen_gguf: str, template: str) -> Path:
    """The model under ~/.cache/gmlx-test-models (written once per VERSION), from Qwen2.5-Coder's GGUF."""
    out = Path.home() / ".cache" / "gmlx-test-models" / f"qwen3-thinking-bigram-v{VERSION}.gguf"
    if out.exists():
        return out
    meta, tokens = _tokenizer(qwen_gguf)
    arch = {f"qwen3.{k}": v for k, v in {
        "block_count": 1, "context_length": 4096, "embedding_length": HIDDEN, "feed_forward_length": FFN,
        "attention.head_count": HEADS, "attention.head_count_kv": KV, "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM, "rope.freq_base": 1000000.0,
        "attention.layer_norm_rms_epsilon": 1e-6}.items()}
    meta = {**arch, **meta, "general.name": "Qwen3 thinking bigram (test)", "tokenizer.chat_template": template}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    write_gguf(tmp, _weights(tokens), arch="qwen3", metadata=meta)
    tmp.rename(out)
    return out
