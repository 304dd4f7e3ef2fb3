"""Loading an HF checkpoint directory into tunix's nnx model (the trainer's copy).

Owns the translation of an HF `config.json` into tunix's `ModelConfig` for the architectures
tunix ships (qwen3, qwen2, llama) and the call to tunix's own safetensors loader. Used for the
built-in tiny model and for real checkpoints alike. Copies nothing of tunix's loaders. RoPE
settings tunix's models ignore are applied through `tunix_adapter.rope`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax

from sgl_jax_rollout import tunix_compat
from tunix_adapter.rope import fix_rope, rope_config

# HF model_type -> tunix package under tunix.models, and the name of its tied-embedding flag.
_TUNIX_MODELS = {
    "qwen3": ("qwen3", "use_tied_embedding"),
    "qwen2": ("qwen2", "use_tied_embedding"),
    "llama": ("llama3", "weight_tying"),
}


def _hf_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"model_dir must hold a config.json, none found at {path}")
    return json.loads(path.read_text())


def tunix_model_config(model_dir: str | Path):
    """tunix `ModelConfig` equivalent to the HF config in `model_dir`."""
    return _tunix_config_and_package(model_dir)[0]


def _tunix_config_and_package(model_dir: str | Path):
    hf = _hf_config(model_dir)
    model_type = hf.get("model_type")
    if model_type not in _TUNIX_MODELS:
        raise ValueError(
            f"config.json model_type must be one of {sorted(_TUNIX_MODELS)}, got {model_type!r}"
        )
    package, tied_flag = _TUNIX_MODELS[model_type]
    model_lib = tunix_compat.model_module(package, "model")
    heads = hf["num_attention_heads"]
    config = model_lib.ModelConfig(
        num_layers=hf["num_hidden_layers"],
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"],
        num_heads=heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        rope_theta=hf.get("rope_theta", 10_000),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        **{tied_flag: bool(hf.get("tie_word_embeddings", False))},
    )
    # tunix's llama3 / qwen3 attention ignores the config's RoPE: compute what it defines.
    fix_rope()
    return rope_config(package, config, hf), package


def load_tunix_model(model_dir: str | Path, mesh: jax.sharding.Mesh | None = None):
    """The nnx model of `model_dir`, loaded by tunix's own safetensors loader."""
    config, package = _tunix_config_and_package(model_dir)
    params = tunix_compat.model_module(package, "params")
    return params.create_model_from_safe_tensors(str(model_dir), config, mesh=mesh)
