"""A tiny random-weight Kokoro directory, built with mlx-audio's own classes (no MLX voice ships in a package
reachable here): Kokoro-82M's layout with a small PL-BERT and one residual block per upsampling stage (its
decoder's 512/1024-channel widths are fixed by mlx-audio's code), written the way Kokoro's MLX repositories hold
it (PyTorch conv layouts that mlx-audio's sanitize turns around), plus voice packs named like Kokoro's.

Convolutions get random weight-norm directions (mlx-audio initialises them to ones, which makes every channel the
same) and the generator's output bias keeps the spectrum's magnitude (exp of it) so speech stays within [-1, 1].
Built once into ~/.cache/gmlx-test-models/kokoro-tiny-<version>/ (atomic rename) and checked to load back equal.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("GMLX_TEST_MODELS", Path.home() / ".cache" / "gmlx-test-models"))
VERSION = "v2"  # bump when the model below changes
SEED = 1234
VOICES = ("ef_uno", "ff_trois", "af_one", "jf_yon")  # Spanish, French (espeak G2P), English, Japanese (misaki's)
# StyleTTS 2's symbols, Kokoro's vocabulary: pad, punctuation, ASCII letters, IPA
SYMBOLS = ("$;:,.!?¡¿—…\"«»“” ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
           "ɑɐɒæɓʙβɔɕçɗɖðʤəɘɚɛɜɝɞɟʄɡɠɢʛɦɧħɥʜɨɪʝɭɬɫɮʟɱɯɰŋɳɲɴøɵɸθœɶʘɹɺɾɻʀʁɽʂʃʈʧʉʊʋⱱʌɣɤʍχʎʏʑʐʒʔʡʕʢǀǁǂǃˈˌːˑʼʴʰʱʲʷˠˤ˞↓↑→↗↘'̩ᵻ")


def config() -> dict[str, Any]:
    vocab = {s: i for i, s in enumerate(dict.fromkeys(SYMBOLS))}
    return {"model_type": "kokoro", "dim_in": 64, "dropout": 0.2, "hidden_dim": 512, "max_conv_dim": 512,
            "max_dur": 4, "multispeaker": True, "n_layer": 1, "n_mels": 80, "n_token": len(vocab) + 2,
            "style_dim": 128, "text_encoder_kernel_size": 5, "sample_rate": 24000, "vocab": vocab,
            "istftnet": {"upsample_kernel_sizes": [20, 12], "upsample_rates": [10, 6], "gen_istft_hop_size": 5,
                         "gen_istft_n_fft": 20, "resblock_dilation_sizes": [[1, 3, 5]], "resblock_kernel_sizes": [3],
                         "upsample_initial_channel": 512},
            "plbert": {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
                       "max_position_embeddings": 512, "num_hidden_layers": 1, "dropout": 0.1}}


def stored_layout(model: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Each weight as a checkpoint holds it: the layout (as is, or conv-transposed) that sanitize maps back."""
    import mlx.core as mx

    out = {}
    for key, value in params.items():
        for cand in [value, *([value.transpose(0, 2, 1)] if value.ndim == 3 else [])]:
            back = model.sanitize({key: cand}).get(key)
            if back is not None and back.shape == value.shape and mx.array_equal(back, value):
                out[key] = cand
                break
        else:
            raise AssertionError(f"no stored layout of {key} {value.shape} survives mlx-audio's sanitize")
    return out


def build(out: Path) -> None:
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.kokoro import kokoro
    from mlx_audio.tts.utils import load_model

    cfg = config()
    mx.random.seed(SEED)
    model = kokoro.Model(kokoro.ModelConfig.from_dict(cfg))
    params = {k: mx.random.normal(v.shape) if k.endswith("weight_v") else v
              for k, v in tree_flatten(model.parameters())}
    bias = "decoder.generator.conv_post.bias"
    params[bias] = mx.full(params[bias].shape, -5.5)
    model.load_weights(list(params.items()))
    (out / "voices").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    mx.save_safetensors(str(out / "kokoro-tiny.safetensors"), stored_layout(model, params))
    rng = np.random.default_rng(SEED)
    for name in VOICES:  # Kokoro's packs: one 256-wide style per phoneme count, 510 of them
        pack = (rng.standard_normal((510, 1, 256)) * 0.5).astype(np.float32)
        mx.save_safetensors(str(out / "voices" / f"{name}.safetensors"), {"voice": mx.array(pack)})
    loaded = dict(tree_flatten(load_model(out, strict=True).parameters()))
    assert loaded.keys() == params.keys() and all(mx.array_equal(loaded[k], v) for k, v in params.items())


def tiny_kokoro() -> Path:
    out = CACHE / f"kokoro-tiny-{VERSION}"
    if not (out / "config.json").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="kokoro-", dir=CACHE))
        try:
            build(tmp / "model")
            (tmp / "model").rename(out)
        except OSError:
            if not (out / "config.json").exists():  # not another session's build that won the rename
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
