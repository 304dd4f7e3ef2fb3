"""Where a narrow-dtype (bfloat16) engine rounds as tunix's trainer rounds.

Owns `TrainerRounding` / `trainer_rounding` (what tunix's model of a config.json `model_type`
rounds differently from sgl-jax, `NORM_RULES`, `ATTENTION_WEIGHTS_ROUNDED`), `rms_norm` (an
RMS norm computed by a rule), `excess_precision` (whether XLA may skip roundings this
process) and `described` (all of it in words, for `check`).
Nothing here imports sgl-jax or this project.

Read op by op against sgl-project/sglang-jax cddbf6f1 (`layers/layernorm.py`,
`layers/embeddings.py`, `layers/attention/native_backend.py`) and google-tunix 0.1.7 / main
c7d8950f (`models/{qwen2,qwen3,llama3,gemma,gemma3,gemma4}/model.py`), and `layers/gate.py`,
`layers/moe.py`. Aligned here:
- RMS norm: tunix's Qwen multiplies the weight by `x / rms` in float32 (`w * (x / rms)`),
  sgl-jax multiplies `x` by `rsqrt(ms + eps) * w` in float32: one float32 ulp apart in many
  elements, a bfloat16 step apart in a few (the final norm feeds the logits); tunix's Gemma
  2 / 3 norm (`x * (1 + w)`) computes every step in the activation dtype, sgl-jax's
  `GemmaRMSNorm` in float32 (`GEMMA_NORM_IN_DTYPE`);
- attention weights: tunix normalises the softmax in float32 and rounds each weight to the
  activation dtype before the value product (`softmax(...).astype(dtype)`); sgl-jax (and
  `engine/paged_attention.py` by default) keeps them unnormalised in float32 and divides the
  sum once. tunix's Gemma 2 / 3 take the softmax itself in the activation dtype
  (`jax.nn.softmax` on bfloat16 scores: the max, `exp(s - max)`, the sum accumulated in
  float32 then rounded, each division rounded; `SOFTMAX_IN_DTYPE`);
- router: tunix's Qwen3-MoE takes its router logits in the activation dtype, softmax and
  top-k renormalisation in float32, and rounds the routing weights to the activation dtype
  before they weigh the experts; sgl-jax takes the logits as a float32 product and weighs in
  float32 (`ROUTER_IN_DTYPE`; sgl-jax's CPU / GPU experts, not the fused TPU kernel);
- RoPE: tunix's Llama 3 and Gemma 2 / 3 rotate in float32 by float32 cos and sin and round
  once, sgl-jax rounds cos and sin to the activation dtype first (`RotaryEmbedding.__call__`;
  `ROPE_IN_FLOAT32`; tunix's Qwen2 / 3 and Gemma 4 round them too, as sgl-jax does).
Not aligned (upstream's rounding serves them under both settings): tunix's Llama 3 returns
bfloat16 logits, so its trainer divides them by a bfloat16 temperature; its RMS norm divides
the weighted `x`, a product in the activation dtype (`(w * x) / rms`). That norm was aligned
bit for bit at the op level, yet on the llama-3.1-8b replica (bfloat16, 4 x 4 x 32 tokens past
position 1,024) it doubled the engine's mean gap to the bfloat16 trainer with XLA's excess
precision off (0.0154 against 0.0077 without it; 0.0131 with none of these roundings) and left
it unchanged with excess precision on (0.0128 against 0.0126): not applied, cause not found.

The larger part of the gap is neither: XLA on CPU and GPU (and TPU) may keep a fused chain of
bfloat16 ops in float32 (`xla_allow_excess_precision`, on by default), so each program rounds
where its fusions end, and the trainer's and the engine's fuse differently. Measured on a
bfloat16 Qwen3-0.6B replica (tunix's trainer in bfloat16): the trainer against itself compiled
with the flag off moves by 0.018 nats on average; engine against trainer, both with it off and
this module's rounding, 0.0007 (docs/guide.md). It is a process flag
(`XLA_FLAGS=--xla_allow_excess_precision=false`, before JAX starts its backend).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

EXCESS_PRECISION_FLAG = "--xla_allow_excess_precision=false"

# config.json model_type -> how tunix's model weighs its RMS norm (see the module docstring).
NORM_RULES = {
    "qwen2": "weight_times_normed",
    "qwen3": "weight_times_normed",
    "qwen3_moe": "weight_times_normed",
}
# The model_types whose tunix RMS norm (`x * (1 + w)`, Gemma's) computes every step in the
# activation dtype (`models/{gemma,gemma3}/model.py` `RMSNorm`), where sgl-jax's `GemmaRMSNorm`
# computes in float32 and rounds once.
GEMMA_NORM_IN_DTYPE = frozenset({"gemma2", "gemma3", "gemma3_text"})
GEMMA_NORM_RULE = "unit_offset_in_dtype"  # `rms_norm`'s rule for them
# The model_types whose tunix attention rounds its float32-normalised weights before the
# value product.
ATTENTION_WEIGHTS_ROUNDED = frozenset({"qwen2", "qwen3", "qwen3_moe", "llama", "gemma4"})
# The model_types whose tunix attention takes the whole softmax in the activation dtype
# (`models/{gemma,gemma3}/model.py`: `jax.nn.softmax(padded_logits)` on bfloat16 logits).
SOFTMAX_IN_DTYPE = frozenset({"gemma2", "gemma3", "gemma3_text"})
# The model_types whose tunix router rounds its logits and routing weights to the activation
# dtype (`models/qwen3/model.py` `MoELayer.__call__`).
ROUTER_IN_DTYPE = frozenset({"qwen3_moe"})
# The model_types whose tunix RoPE rotates in float32 and rounds once (`models/{llama3,gemma,
# gemma3}/model.py` `apply_rope`: cos and sin kept float32).
ROPE_IN_FLOAT32 = frozenset({"llama", "gemma2", "gemma3", "gemma3_text"})


@dataclasses.dataclass(frozen=True)
class TrainerRounding:
    """What an engine rounds as the trainer does: `norm` (a `NORM_RULES` value for sgl-jax's
    `RMSNorm`, or None for upstream's), `attention_weights` (round normalised attention weights
    to the activation dtype before the value product), `softmax_in_dtype` (the attention's
    whole softmax in the activation dtype), `gemma_norm` (sgl-jax's `GemmaRMSNorm` by the
    "unit_offset_in_dtype" rule), `router_in_dtype` (a MoE's router logits and routing
    weights rounded to the activation dtype) and `rope_in_float32` (the rotation in float32,
    rounded once)."""

    norm: str | None = None
    attention_weights: bool = False
    softmax_in_dtype: bool = False
    gemma_norm: bool = False
    router_in_dtype: bool = False
    rope_in_float32: bool = False


def trainer_rounding(model_type: str, setting: str) -> TrainerRounding:
    """The rounding an engine with `EngineSettings.numerics == setting` serves a checkpoint of
    `model_type` with: the trainer's where tunix's model differs and is aligned, else
    upstream's."""
    if setting != "trainer":
        return TrainerRounding()
    return TrainerRounding(
        norm=NORM_RULES.get(model_type),
        attention_weights=model_type in ATTENTION_WEIGHTS_ROUNDED,
        softmax_in_dtype=model_type in SOFTMAX_IN_DTYPE,
        gemma_norm=model_type in GEMMA_NORM_IN_DTYPE,
        router_in_dtype=model_type in ROUTER_IN_DTYPE,
        rope_in_float32=model_type in ROPE_IN_FLOAT32,
    )


def rms_norm(
    x: Float[Array, "*dims features"], weight: Float[Array, " features"], eps: float, rule: str
) -> Float[Array, "*dims features"]:
    """RMS norm of `x` over its last axis weighed by `rule` (tunix's op order), returned in
    `x`'s dtype: in float32 ("weight_times_normed"), or every step in
    `x`'s dtype, the weight as `1 + w` ("unit_offset_in_dtype", tunix's Gemma 2 / 3)."""
    if rule == GEMMA_NORM_RULE:
        var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(var + eps) * (1 + weight.astype(x.dtype))
    x32 = x.astype(jnp.float32)
    rms = jnp.sqrt(jnp.mean(x32**2, axis=-1, keepdims=True) + eps)
    if rule == "weight_times_normed":
        out = weight.astype(jnp.float32) * (x32 / rms)
    else:
        rules = sorted({*NORM_RULES.values(), GEMMA_NORM_RULE})
        raise ValueError(f"rule must be one of {rules}, got {rule!r}")
    return out.astype(x.dtype)


def excess_precision() -> bool:
    """Whether XLA may keep narrow-dtype intermediates wider this process (its default):
    False only where `XLA_FLAGS` turns it off."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    values = [f.split("=", 1)[1] for f in flags if f.startswith("--xla_allow_excess_precision=")]
    return not values or values[-1].lower() not in ("false", "0")


def described(model_type: str, setting: str) -> str:
    """The rounding of `trainer_rounding`, and XLA's excess precision, in words."""
    rounding = trainer_rounding(model_type, setting)
    parts = []
    if rounding.norm:
        parts.append(f"RMS norm as tunix's {model_type} ({rounding.norm.replace('_', ' ')})")
    if rounding.gemma_norm:
        parts.append(f"RMS norm as tunix's {model_type} (every step in the activation dtype)")
    if rounding.attention_weights:
        parts.append("attention weights rounded before the value product")
    if rounding.softmax_in_dtype:
        parts.append("attention softmax in the activation dtype")
    if rounding.router_in_dtype:
        parts.append("router logits and routing weights in the activation dtype")
    if rounding.rope_in_float32:
        parts.append("RoPE rotation in float32")
    ours = "; ".join(parts) or f"sgl-jax's (numerics={setting!r}, model_type {model_type!r})"
    xla = "on (each program rounds where its fusions end)" if excess_precision() else "off"
    return f"{ours}; XLA excess precision {xla}"
