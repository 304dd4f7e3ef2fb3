"""Trainer agreement: where sgl-jax rounds a number another way than the trainer does
(catalog: `patches/__init__.py`).

Owns `install` for `rope_phases`, `rms_norm_order`, `gemma_norm_in_dtype` (the same for
`GemmaRMSNorm.__call__`, which computes in float32 where tunix's Gemma 2 / 3 norm computes
every step in bfloat16, `1 + w` included), `router_in_dtype` (`GateLogit.__call__`, whose
router logits are a float32 product where tunix's Qwen3-MoE rounds them to bfloat16 before
its float32 softmax, and `EPMoE.__call__`, which weighs the experts' outputs by float32
routing weights where tunix rounds them to bfloat16 first) and `rope_in_float32`
(`RotaryEmbedding.__call__`, which rounds cos and sin to the activation dtype before the
rotation, where tunix's Llama 3 and Gemma 2 / 3 rotate in float32 and round once).
`rms_norm_order` wraps
`RMSNorm.__call__` (`layers/layernorm.py` at cddbf6f1: `x * (rsqrt(ms + eps) * w)`): a
bfloat16 (narrower than float32) norm of an engine whose `numerics` is "trainer" weighs its
normalised input in tunix's op order (`numerics.rms_norm`, the rule of
`EngineHooks.numerics`); float32 norms, norms with a mask or without a weight stay upstream's.
`rope_phases` wraps `RotaryEmbedding._compute_cos_sin` to compute a plain
rotary embedding's phases (sgl-jax's `RotaryEmbedding` itself, or a subclass that declares
`linear_phase_scaling`, as Gemma 3's) by the phase rule of the engine running it
(`EngineHooks.rope_phases`, `engine/rope_phases.py`), and `phase_rule`, which says that rule.
The rule is read when the phases are computed (the engine's forward being traced), never
stored on the embedding: sgl-jax caches rotary embeddings across engines (`get_rope`'s
`_ROPE_DICT`, `layers/embeddings.py:601-647` at cddbf6f1), so a rule stored at construction
would serve a later engine of the same process with an earlier one's. A subclass with
frequencies of its own (llama3 scaling, YaRN, Gemma 4's proportional RoPE), an engine whose
rule is "inv_freq", and phases computed with no engine active keep upstream's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from sgl_jax_rollout.engine import numerics, rope_phases, upstream
from sgl_jax_rollout.engine.patches.hooks import current, wrap


def install() -> None:
    wrap(upstream.get("RotaryEmbedding"), "_compute_cos_sin", _phases_by_rule)
    wrap(upstream.get("RMSNorm"), "__call__", _norm_by_rule)
    wrap(upstream.get("GemmaRMSNorm"), "__call__", _gemma_norm_by_rule)
    wrap(upstream.get("GateLogit"), "__call__", _router_logits_by_rule)
    wrap(upstream.get("EPMoE"), "__call__", _experts_by_rule)
    wrap(upstream.get("RotaryEmbedding"), "__call__", _rope_by_rule)


def phase_rule(rotary: Any) -> str:
    """The rule `rotary`'s phases are computed by now: the active engine's on a plain rotary
    embedding, else upstream's ("inv_freq")."""
    hooks = current()
    plain = type(rotary) is upstream.get("RotaryEmbedding") or getattr(
        type(rotary), "linear_phase_scaling", False
    )
    return hooks.rope_phases if hooks is not None and plain else "inv_freq"


def _phases_by_rule(original, self: Any, positions):
    rule = phase_rule(self)
    if rule == "inv_freq":
        return original(self, positions)
    return rope_phases.cos_sin(
        positions, self.rotary_dim, self.base, rule, getattr(self, "scaling_factor", 1.0)
    )


def _norm_by_rule(original, self: Any, x, mask=None):
    """rms_norm_order: a narrow-dtype RMS norm with a weight, over the last axis, computed in
    the running engine's rule (`numerics.rms_norm`); any other upstream's."""
    hooks = current()
    rule = hooks.numerics.norm if hooks is not None else None
    plain = mask is None and self.scale is not None and self.reduction_axes in (-1, (-1,))
    narrow = jnp.finfo(x.dtype).bits < 32 and self.dtype in (None, x.dtype)
    if rule is None or not (plain and narrow):
        return original(self, x, mask)
    return numerics.rms_norm(x, self.scale[...], self.epsilon, rule)


def _gemma_norm_by_rule(original, self: Any, x, residual=None):
    """gemma_norm_in_dtype: a narrow-dtype `x * (1 + w)` norm of an engine whose rounding says
    `gemma_norm` computes every step in `x`'s dtype (tunix's Gemma 2 / 3), after upstream's
    residual add; any other upstream's."""
    hooks = current()
    aligned = hooks is not None and hooks.numerics.gemma_norm and self.add_unit_offset
    if not aligned or jnp.finfo(x.dtype).bits >= 32:
        return original(self, x, residual)
    if residual is not None:  # upstream's: the sum in x's dtype is the next residual
        x = x + residual
        residual = x
    out = numerics.rms_norm(x, self.weight[...], self.epsilon, numerics.GEMMA_NORM_RULE)
    return out if residual is None else (out, residual)


def _router_in_dtype(x) -> bool:
    hooks = current()
    return hooks is not None and hooks.numerics.router_in_dtype and jnp.finfo(x.dtype).bits < 32


def _router_logits_by_rule(original, self: Any, hidden_states):
    """router_in_dtype: a softmax router of a narrow-dtype engine whose rounding says
    `router_in_dtype` takes its logits in the activation dtype, then the softmax in float32
    (tunix's Qwen3-MoE: `nnx.Linear(dtype=bfloat16)`, `.astype(float32)`, `softmax`); any
    other upstream's."""
    if self.score_func != "softmax" or self.bias is not None or not _router_in_dtype(hidden_states):
        return original(self, hidden_states)
    logits = jnp.dot(hidden_states, self.kernel[...].astype(hidden_states.dtype))
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def _experts_by_rule(original, self: Any, hidden_states, topk_weights, topk_ids, **kwargs):
    """router_in_dtype: the routing weights rounded to the activation dtype before they weigh
    the experts' outputs (tunix's `routing_weights.astype(self.dtype)`)."""
    if _router_in_dtype(hidden_states):
        topk_weights = topk_weights.astype(hidden_states.dtype).astype(topk_weights.dtype)
    return original(self, hidden_states, topk_weights, topk_ids, **kwargs)


def _rope_by_rule(original, self: Any, positions, query, key):
    """rope_in_float32: a narrow-dtype engine whose rounding says `rope_in_float32` rotates
    query and key in float32 by the float32 cos and sin (its phases by `rope_phases`) and
    rounds the result once, as tunix's Llama 3 and Gemma 2 / 3 `apply_rope` do; any other
    upstream's (cos and sin rounded first)."""
    hooks = current()
    aligned = hooks is not None and hooks.numerics.rope_in_float32
    if not aligned or jnp.finfo(query.dtype).bits >= 32:
        return original(self, positions, query, key)
    positions = positions.flatten()
    cos, sin = self._compute_cos_sin(positions)
    rotate = upstream.get("apply_rotary_emb")

    def rotated(x):
        heads = x.reshape(positions.shape[0], -1, self.head_size)
        part = heads[..., : self.rotary_dim].astype(jnp.float32)
        turned = rotate(part, cos, sin, self.is_neox_style).astype(x.dtype)
        return jnp.concatenate((turned, heads[..., self.rotary_dim :]), axis=-1).reshape(x.shape)

    return rotated(query), rotated(key)
