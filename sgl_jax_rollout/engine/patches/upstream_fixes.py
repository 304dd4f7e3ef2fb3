"""Upstream bug fixes, each to drop the day sgl-jax fixes it (the upstream file and line in
the catalog, `patches/__init__.py`, and in each patch's docstring).

Owns `install` for `llama3_rope_scaling`, `attention_head_dim_unpadded`,
`attention_logit_cap` and `native_attention_per_rank` (one wrapper of the CPU attention),
`cache_loc_copied`, `scheduler_faulthandler` and `sampler_key_typed`; and `unpadded_heads`,
the head cut the attention fix applies.
"""

from __future__ import annotations

import contextvars
import faulthandler
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.dp_attention import per_rank_native_attention
from sgl_jax_rollout.engine.patches.hooks import wrap


def install() -> None:
    get = upstream.get
    scheduler = upstream.module("managers.scheduler")
    if not isinstance(scheduler.faulthandler, _SchedulerFaultHandler):
        scheduler.faulthandler = _SchedulerFaultHandler()
    wrap(get("NativeAttention"), "__call__", _native_attention)
    native = upstream.module("layers.attention.native_backend")
    if not isinstance(native.jnp, _ScoreCappingNumpy):
        native.jnp = _ScoreCappingNumpy()
    wrap(native, "forward_attention", _unpadded_heads)
    wrap(get("Llama3RotaryEmbedding"), "__init__", _llama3_scaled_frequencies)
    wrap(get("ScheduleBatch"), "_merge_cache_loc", _cache_loc_copied)
    wrap(get("ModelRunner"), "initialize_jit", _typed_sampler_key)


def _llama3_scaled_frequencies(original, self, *args, **kwargs):
    """llama3_rope_scaling: the phases read `_inv_freq_np`; give it the scaled frequencies
    (upstream's own `_compute_inv_freq`, evaluated eagerly even inside a model-building trace)."""
    original(self, *args, **kwargs)
    with jax.ensure_compile_time_eval():
        self._inv_freq_np = np.asarray(self._compute_inv_freq(self.base), np.float32)


def _native_attention(original, self, q, k, v, layer, *args, **kwargs):
    """native_attention_per_rank and attention_logit_cap, on upstream's CPU attention."""
    cap = getattr(layer, "logit_cap", None)
    if not cap:
        return per_rank_native_attention(original, self, q, k, v, layer, *args, **kwargs)
    scale = layer.scaling if layer.scaling is not None else 1.0 / float(layer.head_dim) ** 0.5
    token = _SCORE_CAP.set((float(cap), float(scale)))
    try:
        return per_rank_native_attention(original, self, q, k, v, layer, *args, **kwargs)
    finally:
        _SCORE_CAP.reset(token)


# (cap, scale) of the attention layer being traced, for `_ScoreCappingNumpy`.
_SCORE_CAP: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "score_cap", default=None
)


SCORE_SUBSCRIPTS = "qhd,khd->qhk"  # upstream's attention scores, `native_backend.py:256`


class _ScoreCappingNumpy:
    """attention_logit_cap: `jax.numpy` as `layers.attention.native_backend` sees it, whose
    score einsum is soft-capped while a capped layer is traced (`_SCORE_CAP`)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)

    def einsum(self, subscripts, *operands, **kwargs):
        out = jnp.einsum(subscripts, *operands, **kwargs)
        cap = _SCORE_CAP.get()
        if cap is None or subscripts != SCORE_SUBSCRIPTS:
            return out
        limit, scale = cap
        return limit * jnp.tanh(out * (scale / limit)) / scale


def _unpadded_heads(
    original,
    q,
    k_cache,
    v_cache,
    seq_lengths,
    loc,
    extend_prefix_lens,
    extend_seq_lens,
    num_heads,
    *args,
    **kwargs,
):
    """attention_head_dim_unpadded: upstream's attention output with each head cut back from
    the KV pool's padded width to q's head_dim."""
    out = original(
        q,
        k_cache,
        v_cache,
        seq_lengths,
        loc,
        extend_prefix_lens,
        extend_seq_lens,
        num_heads,
        *args,
        **kwargs,
    )
    return unpadded_heads(out, q.shape[-1] if q.ndim == 3 else q.shape[-1] // num_heads, num_heads)


def unpadded_heads(
    out: Float[Array, "tokens width"], head_dim: int, num_heads: int
) -> Float[Array, "tokens heads_x_head_dim"]:
    """`out` ([tokens, num_heads * w]) with each head's first `head_dim` columns, where `w` is
    the pool's padding of `head_dim` to a multiple of 128; any other width is returned as is
    (models whose V head is narrower than their q head)."""
    width = out.shape[-1] // num_heads
    if width == head_dim or width != -(-head_dim // 128) * 128:
        return out
    tokens = out.shape[0]
    return out.reshape(tokens, num_heads, width)[..., :head_dim].reshape(tokens, -1)


def _cache_loc_copied(original, self, *args, **kwargs):
    """cache_loc_copied: on CPU, a copy of upstream's view of its persistent host buffer (the
    CPU client may alias the buffer, which the next step rewrites while this one runs)."""
    cache_loc = original(self, *args, **kwargs)
    return cache_loc.copy() if jax.default_backend() == "cpu" else cache_loc


class _SchedulerFaultHandler:
    """scheduler_faulthandler: `faulthandler`, with `enable()` falling back to the process's
    real stderr where `sys.stderr` has no file descriptor."""

    def __getattr__(self, name: str) -> Any:
        return getattr(faulthandler, name)

    def enable(self, file: Any = None, all_threads: bool = True) -> None:
        if file is None:
            try:
                sys.stderr.fileno()
                file = sys.stderr
            except (AttributeError, OSError, ValueError):
                file = sys.__stderr__
        faulthandler.enable(file=file, all_threads=all_threads)


def _typed_sampler_key(original, self, *args, **kwargs):
    """sampler_key_typed: the runner's base sampler key as a typed key of the implementation it
    was made with, before `initialize_jit` captures it."""
    key = self._sampler_base_rng
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        impl = jax.config.jax_default_prng_impl
        self._sampler_base_rng = jax.random.wrap_key_data(key, impl=impl)
    return original(self, *args, **kwargs)
