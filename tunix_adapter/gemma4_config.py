"""tunix's Gemma 4 `ModelConfig` from an HF Gemma 4 config.json (dense variants, 31B-style).

Owns `gemma4_config`. Every field comes from the checkpoint's `text_config` (a Gemma 4
checkpoint nests its language model's config there):

- `num_hidden_layers`, `vocab_size`, `hidden_size`, `intermediate_size`, `num_attention_heads`:
  `num_layers`, `num_embed`, `embed_dim`, `hidden_dim`, `num_heads`;
- `head_dim`, `num_key_value_heads` (the window's layers): `head_dim`, `num_kv_heads`;
- `global_head_dim`: `global_key_size` (tunix's default is 512, so it is always set);
- `num_global_key_value_heads`: `num_global_kv_heads`, with `attention_k_eq_v` only (HF reads
  it only there, tunix on every full layer);
- `attention_k_eq_v`, `layer_types`, `sliding_window`, `final_logit_softcapping`:
  `k_eq_v_global`, `attention_pattern` (the whole tuple), `sliding_window_size`,
  `final_logit_softcap`;
- `rope_parameters.{sliding,full}_attention` `rope_theta`, `factor`, and the full layers'
  `partial_rotary_factor`: `{local,global}_base_frequency`, `{local,global}_scale_factor`,
  `global_rope_proportion`.

What tunix computes whatever the config says is checked, and a config that differs is refused
by name: norm epsilon 1e-6 (`model.py:445, 687`), tanh GeLU (`:990`), no attention biases, tied
embeddings (`:337-340`), one RoPE formula, HF's "proportional", for both layer kinds (`:451-503`:
the window's layers must be "default" RoPE with no partial factor, where the two agree).
Variants the engine cannot serve are refused too (sgl-jax `srt/models/gemma4.py` at cddbf6f1 has
neither per-layer embeddings nor KV sharing, E2B / E4B; MoE, 26B-A4B, is not mapped here).
Query scale 1, the weightless value norm, embeddings times sqrt(hidden) and the layer scalar
are Gemma 4's own and the same on both sides.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout import tunix_compat

_KINDS = ("sliding_attention", "full_attention")


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a Gemma 4 config.json (nested or not)."""
    return hf.get("text_config") or hf


def gemma4_config(hf: dict[str, Any]):
    """tunix's Gemma 4 `ModelConfig` of config.json `hf`; ValueError naming the field that
    tunix or the engine cannot follow."""
    text = text_config(hf)
    _refuse_unserved(text, hf)
    model_lib = tunix_compat.model_module("gemma4", "model")
    layers = text["num_hidden_layers"]
    kinds = text.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != layers or set(kinds) - set(_KINDS):
        raise ValueError(
            f"config.json text_config.layer_types must list {layers} layers, each one of "
            f"{list(_KINDS)}; got {kinds!r}"
        )
    local, full = _rope(text)
    attention = model_lib.AttentionType
    k_eq_v = bool(text.get("attention_k_eq_v", False))
    softcap = text.get("final_logit_softcapping")
    return model_lib.ModelConfig(
        num_layers=layers,
        num_embed=text["vocab_size"],
        embed_dim=text["hidden_size"],
        hidden_dim=text["intermediate_size"],
        num_heads=text["num_attention_heads"],
        head_dim=text["head_dim"],
        num_kv_heads=text["num_key_value_heads"],
        num_global_kv_heads=text.get("num_global_key_value_heads") if k_eq_v else None,
        global_key_size=text.get("global_head_dim") or text["head_dim"],
        k_eq_v_global=k_eq_v,
        attention_pattern=tuple(
            attention.LOCAL_SLIDING if kind == "sliding_attention" else attention.GLOBAL
            for kind in kinds
        ),
        sliding_window_size=text.get("sliding_window"),
        final_logit_softcap=float(softcap) if softcap else None,
        local_base_frequency=local["rope_theta"],
        global_base_frequency=full["rope_theta"],
        local_scale_factor=float(local.get("factor", 1.0)),
        global_scale_factor=float(full.get("factor", 1.0)),
        local_rope_proportion=1.0,
        global_rope_proportion=float(full.get("partial_rotary_factor", 1.0)),
    )


def _refuse_unserved(text: dict[str, Any], hf: dict[str, Any]) -> None:
    fixed = {
        "rms_norm_eps": (1e-6, "model.py:445"),
        "hidden_activation": ("gelu_pytorch_tanh", "model.py:990"),
        "attention_bias": (False, "no biases"),
        "tie_word_embeddings": (True, "model.py:337-340"),
    }
    for key, (value, where) in fixed.items():
        got = text.get(key, hf.get(key, value))
        if got != value:
            raise ValueError(
                f"config.json text_config.{key}={got!r}: tunix's Gemma 4 computes with "
                f"{key}={value!r} only (tunix/models/gemma4/{where}), so its trainer would "
                "score another model"
            )
    unserved = {
        "hidden_size_per_layer_input": "per-layer embeddings (E2B, E4B)",
        "num_kv_shared_layers": "KV sharing across layers (E2B, E4B)",
        "enable_moe_block": "a mixture-of-experts block (26B-A4B)",
    }
    for key, what in unserved.items():
        if text.get(key):
            raise ValueError(
                f"config.json text_config.{key}={text[key]!r}: {what} is not served; sgl-jax's "
                "Gemma 4 (srt/models/gemma4.py at cddbf6f1) implements neither per-layer "
                "embeddings nor KV sharing, and this rollout maps dense Gemma 4 only"
            )


def _rope(text: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    rope = text.get("rope_parameters") or {}
    if not all(kind in rope for kind in _KINDS):
        raise ValueError(
            f"config.json text_config.rope_parameters must have entries {list(_KINDS)} (Gemma "
            f"4's); got {sorted(rope)}"
        )
    local, full = rope["sliding_attention"], rope["full_attention"]
    if (
        local.get("rope_type", "default") != "default"
        or local.get("partial_rotary_factor", 1.0) != 1
    ):
        raise ValueError(
            f"config.json rope_parameters.sliding_attention={local!r}: tunix's Gemma 4 rotates "
            "the window's layers with rope_type 'default' and every dimension only "
            "(tunix/models/gemma4/model.py:451-503)"
        )
    if full.get("rope_type", "default") not in ("default", "proportional") or (
        full.get("rope_type", "default") == "default" and full.get("partial_rotary_factor", 1) != 1
    ):
        raise ValueError(
            f"config.json rope_parameters.full_attention={full!r}: tunix's Gemma 4 computes "
            "HF's 'proportional' RoPE (or 'default' with every dimension rotated) only"
        )
    return local, full
