"""Tiny random-weight vision models, built the honest way: transformers makes them, llama.cpp's own
`convert_hf_to_gguf.py` (with `--mmproj`) writes their text GGUF and projector GGUF.

One per supported family: Gemma 3 (SigLIP tower, pooled projector) and Idefics3 (SmolVLM's architecture:
SigLIP tower, pixel-shuffle connector, a llama text model). Each has a small SentencePiece vocabulary trained here, so
the converter's SentencePiece path writes the tokenizer, the family's chat template, a real processor
config, and weights rounded to fp16-representable values, so the f16 GGUFs hold exactly what transformers
runs. Built once into ~/.cache/gmlx-test-models/vision-<version>/ (atomic rename), reused after.

The converter ships in the llama-cpp-python sdist (vendor/llama.cpp); it is fetched with pip into the same
cache, and the tests skip, saying why, when it cannot be.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CACHE = Path(os.environ.get("GMLX_TEST_MODELS", Path.home() / ".cache" / "gmlx-test-models"))
LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors llama.cpp with the converter for both families
VERSION = "v3"  # bump when a model below changes
SEED = 1234

GEMMA_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
IDEFICS3_SPECIALS = ["<|im_start|>", "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                    *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
CORPUS = """The quick brown fox jumps over the lazy dog.
What is in this image? Describe the picture in one word.
A red square on a white background, with blue circles and green lines.
The cat sat on the mat and looked at the small bird outside the window.
Please compare these two pictures and tell me which one is brighter.
Numbers like 1234567890 and words like colour, shape, size and light.
User: hello there. Assistant: hi, how can I help you today?
"""


@dataclass(frozen=True)
class TinyVLM:
    family: str  # "gemma3" or "idefics3"
    hf_dir: Path  # transformers' model + processor (the reference, and the MLX-directory path)
    text_gguf: Path
    mmproj_gguf: Path


def tiny_vlm(family: str) -> TinyVLM:
    """The family's tiny model, built on first use; skips when torch or the converter is unavailable."""
    pytest.importorskip("torch", reason="building the tiny vision models needs torch (scripts/setup.sh --test)")
    root = CACHE / f"vision-{VERSION}" / family
    if not (root / "done").exists():
        _build(family, root)
    return TinyVLM(family, root / "hf", root / f"{family}-tiny-f16.gguf", root / f"mmproj-{family}-tiny-f16.gguf")


def tiny_text_dir() -> Path:
    """A tiny random llama text model as a Hugging Face directory (config.json, safetensors, tokenizer): the
    model-directory path's text-only case."""
    pytest.importorskip("torch", reason="building the tiny models needs torch (scripts/setup.sh --test)")
    root = CACHE / f"vision-{VERSION}" / "llama-text"
    if not (root / "done").exists():
        staging = root.with_name(root.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        _build_llama_text(staging / "hf")
        (staging / "done").write_text(VERSION)
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
    return root / "hf"


def converter() -> Path:
    """llama.cpp's convert_hf_to_gguf.py from the llama-cpp-python sdist, fetched once with pip."""
    dest = CACHE / f"llama.cpp-{LLAMA_CPP_PYTHON}"
    script = dest / "convert_hf_to_gguf.py"
    if script.exists():
        return script
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                              "--disable-pip-version-check", "-q", "-d", tmp, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"],
                             capture_output=True, text=True, timeout=600)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if got.returncode != 0 or not sdists:
            pytest.skip(f"llama.cpp's converter is unavailable: pip download llama-cpp-python=={LLAMA_CPP_PYTHON} "
                        f"failed ({(got.stderr or got.stdout).strip()[-300:]})")
        _extract_converter(sdists[0], dest)
    return script


def _extract_converter(sdist: Path, dest: Path) -> None:
    """Only the converter's files: the script, its conversion package and gguf-py."""
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    keep = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            _, _, rel = m.name.partition("/vendor/llama.cpp/")
            if rel and rel.startswith(keep) and (m.isfile() or m.isdir()):
                m.name = rel
                tar.extract(m, staging, filter="data")
    staging.rename(dest)


def _build(family: str, root: Path) -> None:
    script = converter()
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    hf = staging / "hf"
    (_build_gemma3 if family == "gemma3" else _build_idefics3)(hf)
    for mmproj, out in ((False, f"{family}-tiny-f16.gguf"), (True, f"mmproj-{family}-tiny-f16.gguf")):
        cmd = [sys.executable, str(script), str(hf), "--outtype", "f16", "--outfile", str(staging / out)]
        done = subprocess.run([*cmd, "--mmproj"] if mmproj else cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"convert_hf_to_gguf.py failed on {family}:\n{done.stderr[-3000:]}")
    (staging / "done").write_text(VERSION)
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)


def _sentencepiece(out: Path, specials: list[str], gemma: bool) -> None:
    import sentencepiece as spm

    buf = io.BytesIO()
    ids = {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3} if gemma else {"unk_id": 0, "bos_id": 1, "eos_id": 2,
                                                                            "pad_id": 3}
    names = ({"pad_piece": "<pad>", "eos_piece": "<eos>", "bos_piece": "<bos>", "unk_piece": "<unk>"} if gemma
             else {"pad_piece": "<pad>", "eos_piece": "</s>", "bos_piece": "<s>", "unk_piece": "<unk>"})
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines() * 20), model_writer=buf, vocab_size=420, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, add_dummy_prefix=not gemma, normalization_rule_name="identity",
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, split_digits=True,
        user_defined_symbols=specials, num_threads=1, minloglevel=2, hard_vocab_limit=False, **ids, **names)
    out.write_bytes(buf.getvalue())


def _published_rope(hf: Path) -> None:
    """config.json's text_config with the RoPE keys published checkpoints carry (transformers 5 writes only
    rope_parameters, which mlx-vlm's configs do not read)."""
    path = hf / "config.json"
    cfg = json.loads(path.read_text())
    text = cfg.get("text_config", cfg)
    rope = text.get("rope_parameters", {})
    if "full_attention" in rope:  # Gemma 3: a global and a local base
        text["rope_theta"] = rope["full_attention"]["rope_theta"]
        text["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    else:
        text["rope_theta"] = rope["rope_theta"]
    path.write_text(json.dumps(cfg, indent=2))


def _added_tokens_decoder(hf: Path) -> None:
    """tokenizer_config.json's added_tokens_decoder, as published checkpoints carry it (transformers 5 keeps
    the added tokens in tokenizer.json only): llama.cpp's SentencePiece path reads their types from it."""
    added = json.loads((hf / "tokenizer.json").read_text())["added_tokens"]
    path = hf / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
    path.write_text(json.dumps(cfg, indent=2))


def _fp16_exact(model: Any, scale: float, never: list[int]) -> None:
    """Random weights with some spread (so greedy choices are not near-ties), rounded to fp16 values; the
    output rows of `never` (end-of-turn tokens) are zero, so greedy generations run their full length."""
    import torch

    torch.manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name or "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "bias" not in name else 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * scale)
            p.copy_(p.half().float())
        model.get_output_embeddings().weight[never] = 0.0


def _save_published(model: Any, hf: Path, renames: dict[str, str]) -> None:
    """save_pretrained, then the tensor names of the family's published checkpoints (transformers 5 saves
    SigLIP towers without their `vision_model.` prefix; llama.cpp's converter maps the published names)."""
    from safetensors.numpy import load_file, save_file

    model.save_pretrained(hf)
    path = hf / "model.safetensors"
    tensors = load_file(path)
    out = {}
    for name, arr in tensors.items():
        for old, new in renames.items():
            if name.startswith(old) and not name.startswith(new):
                name = new + name[len(old):]
        out[name] = arr
    save_file(out, path, metadata={"format": "pt"})


def _build_gemma3(hf: Path) -> None:
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, GemmaTokenizer
    from transformers.models.gemma3 import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from gmlx_server.engine.chat_template import GEMMA_TEMPLATE

    hf.mkdir(parents=True)
    _sentencepiece(hf / "tokenizer.model", GEMMA_SPECIALS, gemma=True)
    tok = GemmaTokenizer.from_pretrained(hf, mask_token=None, extra_special_tokens={
        "image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"})
    ids = {t: tok.convert_tokens_to_ids(t) for t in GEMMA_SPECIALS}
    cfg = Gemma3Config(
        text_config={"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 512,
                     "max_position_embeddings": 4096, "rope_theta": 1_000_000.0, "query_pre_attn_scalar": 16,
                     "mm_tokens_per_image": 4},  # where mlx-vlm's loader reads it (published models: the default 256)
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8, "layer_norm_eps": 1e-6, "vision_use_head": False},
        mm_tokens_per_image=4, image_token_index=ids["<image_soft_token>"], boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"], architectures=["Gemma3ForConditionalGeneration"])
    cfg.text_config.bos_token_id, cfg.text_config.eos_token_id, cfg.text_config.pad_token_id = 2, 1, 0
    model = Gemma3ForConditionalGeneration(cfg).to(torch.float32).eval()
    _fp16_exact(model, 0.25, [1, ids["<end_of_turn>"]])
    _save_published(model, hf, {"vision_tower.": "vision_tower.vision_model."})
    _published_rope(hf)
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    Gemma3Processor(image_processor=images, tokenizer=tok, chat_template=GEMMA_TEMPLATE,
                    image_seq_length=4).save_pretrained(hf)
    _added_tokens_decoder(hf)


def _build_idefics3(hf: Path) -> None:
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, LlamaTokenizer
    from transformers.models.idefics3 import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    hf.mkdir(parents=True)
    _sentencepiece(hf / "tokenizer.model", IDEFICS3_SPECIALS, gemma=False)
    specials = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}
    tok = LlamaTokenizer.from_pretrained(hf, legacy=False, add_bos_token=False, extra_special_tokens=specials)
    cfg = Idefics3Config(
        text_config={"model_type": "llama", "vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 4096, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
                     "tie_word_embeddings": False, "architectures": ["VLlama3ForCausalLM"]},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8, "layer_norm_eps": 1e-6},
        scale_factor=2, image_token_id=tok.convert_tokens_to_ids("<image>"),
        architectures=["Idefics3ForConditionalGeneration"])
    cfg.text_config.bos_token_id, cfg.text_config.eos_token_id = 1, 2
    model = Idefics3ForConditionalGeneration(cfg).to(torch.float32).eval()
    _fp16_exact(model, 0.25, [2, tok.convert_tokens_to_ids("<end_of_utterance>")])
    model.save_pretrained(hf)
    _published_rope(hf)
    images = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3, do_image_splitting=True)
    Idefics3Processor(image_processor=images, tokenizer=tok, chat_template=IDEFICS3_TEMPLATE,
                      image_seq_len=4).save_pretrained(hf)
    _added_tokens_decoder(hf)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _build_llama_text(hf: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizer

    hf.mkdir(parents=True)
    _sentencepiece(hf / "tokenizer.model", ["<|im_start|>", "<|im_end|>"], gemma=False)
    tok = LlamaTokenizer.from_pretrained(hf, legacy=False, add_bos_token=False)
    tok.chat_template = CHATML
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    _fp16_exact(model, 0.25, [2, tok.convert_tokens_to_ids("<|im_end|>")])
    model.save_pretrained(hf)
    tok.save_pretrained(hf)
    _published_rope(hf)
