"""tunix's Gemma 3 `ModelConfig` from an HF Gemma 3 text config.json (`gemma3_text`).

Owns `gemma3_config`. Every field comes from config.json:

- `num_hidden_layers`, `vocab_size`, `hidden_size`, `intermediate_size`: `num_layers`,
  `num_embed`, `embed_dim`, `hidden_dim`;
- `num_attention_heads`, `head_dim`, `num_key_value_heads`: `num_heads`, `head_dim`,
  `num_kv_heads`;
- `sliding_window`, `rope_local_base_freq`, `rope_theta`: `sliding_window_size`,
  `local_base_frequency`, `global_base_frequency`;
- `rope_scaling` (HF applies it to the full layers only, `modeling_gemma3.py:472-480`), linear:
  `global_scale_factor` (tunix divides the phases by it, `model.py:419`, which is HF's linear
  scaling); `local_scale_factor` stays 1;
- `query_pre_attn_scalar`: `query_pre_attn_norm`, tunix's two choices (`model.py:703-710`):
  head_dim, or hidden / heads (27B);
- `torch_dtype`: `param_dtype`.

What tunix computes whatever the config says is checked, and a config that differs is refused
by name: five windowed layers then one full, repeated (`GEMMA3_ATTENTION_PATTERN`,
`model.py:439`, cycled over the layers `:963`), norm epsilon 1e-6 (`:919`), tanh GeLU (`:784`),
no biases (`:751-771`), tied embeddings (`Embedder.decode`, `:359`), no soft-caps, causal
attention, no vision tower (a text checkpoint).
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout import tunix_compat
from sgl_jax_rollout.engine.rope_scaling import scaling_kind

SLIDING, FULL = "sliding_attention", "full_attention"
PERIOD = 6  # tunix's GEMMA3_ATTENTION_PATTERN: five windowed layers, then a full one
_FIXED = {
    "rms_norm_eps": (1e-6, "model.py:919"),
    "hidden_activation": ("gelu_pytorch_tanh", "model.py:784"),
    "attention_bias": (False, "model.py:751-771, no biases"),
    "tie_word_embeddings": (True, "model.py:359, Embedder.decode"),
    "attn_logit_softcapping": (None, "no attention soft-cap"),
    "final_logit_softcapping": (None, "no final soft-cap"),
    "use_bidirectional_attention": (False, "causal attention"),
}


def tunix_layer_kinds(layers: int) -> list[str]:
    """The layer kinds tunix's Gemma 3 computes for `layers` layers, in HF's spelling."""
    return [FULL if (i + 1) % PERIOD == 0 else SLIDING for i in range(layers)]


def gemma3_config(hf: dict[str, Any]):
    """tunix's Gemma 3 `ModelConfig` of config.json `hf`; ValueError naming the field that
    tunix's Gemma 3 does not follow."""
    _refuse_fixed(hf)
    model_lib = tunix_compat.model_module("gemma3", "model")
    layers, heads, hidden = hf["num_hidden_layers"], hf["num_attention_heads"], hf["hidden_size"]
    head_dim = hf.get("head_dim") or hidden // heads
    kinds = hf.get("layer_types") or _pattern_kinds(hf, layers)
    if list(kinds) != tunix_layer_kinds(layers):
        raise ValueError(
            f"config.json layer_types={kinds!r}: tunix's Gemma 3 computes five windowed layers "
            "then one full, repeated (tunix/models/gemma3/model.py:439, GEMMA3_ATTENTION_PATTERN)"
        )
    norm = model_lib.QueryPreAttentionNormalisation
    scalar = hf.get("query_pre_attn_scalar", head_dim)
    if scalar == head_dim:
        query_norm = norm.BY_ONE_OVER_SQRT_HEAD_DIM
    elif scalar == hidden // heads:
        query_norm = norm.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
    else:
        raise ValueError(
            f"config.json query_pre_attn_scalar={scalar}: tunix's Gemma 3 scales queries by "
            f"head_dim ({head_dim}) or hidden_size / num_attention_heads ({hidden // heads}) "
            "** -0.5 only (tunix/models/gemma3/model.py:703-710)"
        )
    import jax.numpy as jnp

    return model_lib.ModelConfig(
        num_layers=layers,
        num_embed=hf["vocab_size"],
        embed_dim=hidden,
        hidden_dim=hf["intermediate_size"],
        num_heads=heads,
        head_dim=head_dim,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        sliding_window_size=hf["sliding_window"],
        local_base_frequency=hf.get("rope_local_base_freq", 10_000.0),
        global_base_frequency=hf.get("rope_theta", 1_000_000.0),
        local_scale_factor=1.0,
        global_scale_factor=_global_scale_factor(hf),
        query_pre_attn_norm=query_norm,
        param_dtype=jnp.dtype(hf.get("torch_dtype") or "bfloat16"),
    )


def _pattern_kinds(hf: dict[str, Any], layers: int) -> list[str]:
    """HF's default layer kinds (`configuration_gemma3.py`): every
    `sliding_window_pattern`-th layer full (6 when absent)."""
    pattern = hf.get("sliding_window_pattern") or PERIOD
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]


def _global_scale_factor(hf: dict[str, Any]) -> float:
    scaled, kind = scaling_kind(hf)
    if not scaled:
        return 1.0
    if kind != "linear":
        raise ValueError(
            f"config.json rope_scaling of type {kind!r}: tunix's Gemma 3 scales the full "
            "layers' RoPE linearly only (tunix/models/gemma3/model.py:419)"
        )
    return float(hf["rope_scaling"]["factor"])


def _refuse_fixed(hf: dict[str, Any]) -> None:
    for key, (value, where) in _FIXED.items():
        got = hf.get(key, value)
        if got != value:
            raise ValueError(
                f"config.json {key}={got!r}: tunix's Gemma 3 computes with {key}={value!r} only "
                f"(tunix/models/gemma3/{where}), so its trainer would score another model"
            )
    if hf.get("vision_config"):
        raise ValueError(
            "config.json vision_config in a gemma3_text config: a multimodal "
            "Gemma3ForConditionalGeneration checkpoint is model_type 'gemma3', its language "
            "model under text_config (whose text part is trained: tunix_adapter.models)"
        )
