"""Loading an HF checkpoint directory into tunix's nnx model (the trainer's copy).

Owns the translation of an HF `config.json` into tunix's `ModelConfig` for the architectures
tunix ships (qwen3 dense and MoE, qwen2, llama, Gemma 2 through `tunix.models.gemma`, Gemma 3
text through `tunix.models.gemma3`, `gemma3_config`, also the text part of a multimodal
Gemma 3 checkpoint, dense Gemma 4 through `tunix.models.gemma4`,
`gemma4_config`) and the call to
tunix's own safetensors loader. tunix's Gemma fixes what Gemma 2's config could set otherwise
(RoPE base 10,000, norm epsilon 1e-6, query scale `head_dim ** -0.5`; `models/gemma/
model.py:288, 420, 715`): a config that differs is refused by name, never served against a
trainer that computes another function. Used for the
built-in tiny model and for real checkpoints alike. Copies nothing of tunix's loaders. RoPE
settings tunix's models ignore are applied through `tunix_adapter.rope`; float32 logits from
tunix 0.1.7's Llama 3 / Gemma 2 / 3, when asked for, through `tunix_adapter.logits_dtype`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from sgl_jax_rollout import tunix_compat
from sgl_jax_rollout.utils import model_dir as model_dir_lib
from tunix_adapter.gemma3_config import gemma3_config
from tunix_adapter.gemma4_config import gemma4_config
from tunix_adapter.gemma_window import fix_sliding_window
from tunix_adapter.logits_dtype import check_logits_dtype, with_float32_logits
from tunix_adapter.rope import fix_rope, rope_config

_GEMMA_TYPES = ("gemma2", "gemma3", "gemma3_text", "gemma4")
# HF model_type -> tunix package under tunix.models, and the name of its tied-embedding flag.
_TUNIX_MODELS = {
    "qwen3": ("qwen3", "use_tied_embedding"),
    "qwen3_moe": ("qwen3", "use_tied_embedding"),
    "qwen2": ("qwen2", "use_tied_embedding"),
    "llama": ("llama3", "weight_tying"),
}


def tunix_model_config(model_dir: str | Path):
    """tunix `ModelConfig` equivalent to the HF config in `model_dir`."""
    return _tunix_config_and_package(model_dir)[0]


def _tunix_config_and_package(model_dir: str | Path):
    hf = model_dir_lib.read_config(model_dir)
    try:
        return _config_of(hf)
    except KeyError as err:
        raise model_dir_lib.missing_key(model_dir, hf, err) from None


def _config_of(hf: dict[str, Any]):
    model_type = hf.get("model_type")
    if model_type == "gemma2":
        fix_sliding_window()  # tunix's window counts a left-padded row's padding
        return _gemma2_config(hf), "gemma"
    if model_type == "gemma3_text":
        return gemma3_config(hf), "gemma3"
    if model_type == "gemma3":  # Gemma3ForConditionalGeneration: its text part
        return gemma3_config(model_dir_lib.language_config(hf)), "gemma3"
    if model_type == "gemma4":
        return gemma4_config(hf), "gemma4"
    if model_type not in _TUNIX_MODELS:
        raise ValueError(
            "config.json model_type must be one of "
            f"{sorted([*_TUNIX_MODELS, *_GEMMA_TYPES])}, got {model_type!r}"
        )
    package, tied_flag = _TUNIX_MODELS[model_type]
    model_lib = tunix_compat.model_module(package, "model")
    heads = hf["num_attention_heads"]
    experts = _moe_fields(hf) if model_type == "qwen3_moe" else {}
    config = model_lib.ModelConfig(
        num_layers=hf["num_hidden_layers"],
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        hidden_dim=hf["moe_intermediate_size"] if experts else hf["intermediate_size"],
        num_heads=heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        rope_theta=hf.get("rope_theta", 10_000),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        **{tied_flag: bool(hf.get("tie_word_embeddings", False))},
        **experts,
    )
    # tunix's llama3 / qwen3 attention ignores the config's RoPE: compute what it defines.
    fix_rope()
    return rope_config(package, config, hf), package


def _moe_fields(hf: dict[str, Any]) -> dict[str, int]:
    """tunix Qwen3 `ModelConfig`'s expert fields for a Qwen3-MoE config. tunix's `MoELayer`
    (`models/qwen3/model.py:692-780`) routes every layer, renormalises the top-k weights and
    has no shared expert: a config that says otherwise is refused by name."""
    fixed = {"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
    for key, value in fixed.items():
        if hf.get(key, value) != value:
            raise ValueError(
                f"config.json {key} must be {value!r} for tunix's Qwen3 MoE layer (every layer "
                f"sparse, top-k weights renormalised), got {hf[key]!r}"
            )
    if hf.get("shared_expert_intermediate_size"):
        raise ValueError(
            "config.json shared_expert_intermediate_size: tunix's Qwen3 MoE layer has no "
            f"shared expert, got {hf['shared_expert_intermediate_size']!r}"
        )
    return {"num_experts": hf["num_experts"], "num_experts_per_tok": hf["num_experts_per_tok"]}


# What tunix's Gemma computes whatever the config says (models/gemma/model.py).
_GEMMA_FIXED = {"rope_theta": 10_000.0, "rms_norm_eps": 1e-6}


def _gemma2_config(hf: dict[str, Any]):
    """tunix's Gemma `ModelConfig` of a Gemma 2 config.json: sliding-window attention on the
    layers HF marks `sliding_attention` (by default every other layer from the first), both
    soft-caps, the post-attention and post-feed-forward norms."""
    model_lib = tunix_compat.model_module("gemma", "model")
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    for key, value in _GEMMA_FIXED.items():
        if float(hf.get(key, value)) != value:
            raise ValueError(
                f"config.json {key}={hf[key]}: tunix's Gemma computes with {key}={value} "
                "only (tunix/models/gemma/model.py), so its trainer would score another model"
            )
    scalar = hf.get("query_pre_attn_scalar", head_dim)
    if scalar != head_dim:
        raise ValueError(
            f"config.json query_pre_attn_scalar={scalar} != head_dim={head_dim}: tunix's Gemma "
            "scales queries by head_dim ** -0.5 (tunix/models/gemma/model.py:420)"
        )
    if not hf.get("tie_word_embeddings", True):
        raise ValueError("config.json tie_word_embeddings=false: tunix's Gemma ties them")
    layers = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)
    ]
    attention = model_lib.AttentionType
    return model_lib.ModelConfig(
        num_layers=layers,
        num_embed=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"],
        num_heads=heads,
        head_dim=head_dim,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        final_logit_softcap=hf.get("final_logit_softcapping"),
        use_post_attn_norm=True,
        use_post_ffw_norm=True,
        attention_types=tuple(
            attention.LOCAL_SLIDING if kind == "sliding_attention" else attention.GLOBAL
            for kind in kinds
        ),
        attn_logits_soft_cap=hf.get("attn_logit_softcapping"),
        sliding_window_size=hf.get("sliding_window"),
    )


def vocab_size(config: Any) -> int:
    """The model vocabulary of a tunix `ModelConfig` (Gemma's names it `num_embed`)."""
    return int(getattr(config, "vocab_size", None) or config.num_embed)


def load_tunix_model(
    model_dir: str | Path,
    mesh: jax.sharding.Mesh | None = None,
    dtype: Any = None,
    logits_dtype: str | None = None,
):
    """The nnx model of `model_dir`, loaded by tunix's own safetensors loader. `dtype` (default
    None): the weights as stored, and tunix's own compute dtype (float32 for its Qwen2 / Qwen3,
    whose configs default to it; the weights' for the others). Given (`jnp.bfloat16`): the
    weights cast to it, and every tunix model computes in it (Qwen's config `dtype` and
    `param_dtype` set), as a trainer on bfloat16 chips runs. `logits_dtype` (default None: as
    tunix's model returns them, bfloat16 from a bfloat16 Llama 3 / Gemma 2 / 3 on tunix 0.1.7):
    "float32" casts them as they leave the model, as tunix main does (`logits_dtype.py`)."""
    check_logits_dtype(logits_dtype)
    config, package = _tunix_config_and_package(model_dir)
    if dtype is not None and hasattr(config, "param_dtype") and hasattr(config, "dtype"):
        config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
    model_dir_lib.check_weights(model_dir)
    if model_dir_lib.read_config(model_dir).get("model_type") == "gemma3":
        _check_gemma3_prefix(model_dir)
    # tunix's Gemma packages name their safetensors loader's module differently
    params = tunix_compat.model_module(
        package, "params_safetensors" if package.startswith("gemma") else "params"
    )
    model = params.create_model_from_safe_tensors(str(model_dir), config, mesh=mesh, dtype=dtype)
    return with_float32_logits(model) if logits_dtype == "float32" else model


def _check_gemma3_prefix(model_dir: str | Path) -> None:
    """A multimodal Gemma 3 checkpoint's language model must sit where tunix's loader reads it:
    `language_model.model.` (its `(?:language_model\\.)?model\\.` patterns,
    `models/gemma3/params_safetensors.py`); under `model.language_model.` tunix skips every
    weight and then fails on a pytree mismatch at `embedder.input_embedding` that names none of
    this."""
    prefix = model_dir_lib.checkpoint_prefix(model_dir, "Gemma3ForConditionalGeneration")
    if prefix != model_dir_lib.LANGUAGE_MODEL_PREFIXES[0]:
        raise ValueError(
            f"{model_dir}: the language model's weights sit under {prefix!r}; tunix's Gemma 3 "
            f"loader reads {model_dir_lib.LANGUAGE_MODEL_PREFIXES[0]!r} or 'model.' only "
            "(tunix/models/gemma3/params_safetensors.py), so it would load none of them; save "
            "the checkpoint with transformers' save_pretrained, which writes "
            f"{model_dir_lib.LANGUAGE_MODEL_PREFIXES[0]!r}"
        )
