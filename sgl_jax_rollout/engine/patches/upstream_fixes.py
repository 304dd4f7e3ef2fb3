"""Upstream bug fixes, each to drop the day sgl-jax fixes it (the upstream file and line in
the catalog, `patches/__init__.py`, and in each patch's docstring).

Owns `install` for `llama3_rope_scaling`, `attention_head_dim_unpadded`,
`attention_logit_cap`, `native_attention_per_rank` and `swa_pool_native_attention` (one wrapper
of the CPU attention), `swa_mapping_copied`, `swa_mapping_not_static`, `cache_loc_copied`,
`scheduler_faulthandler`, `sampler_key_typed`, `cpu_memory_balance`, `lora_text_config`,
`lora_buffers_per_layer` and `experts_matmul_off_tpu`;
`unpadded_heads`, the head cut the attention fix applies, and `window_slots`, the slot
translation of the sliding-window pool.
"""

from __future__ import annotations

import contextvars
import dataclasses
import faulthandler
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.dp_attention import per_rank_native_attention
from sgl_jax_rollout.engine.grouped_matmul import grouped_matmul
from sgl_jax_rollout.engine.native_attention import (
    paged_native_attention,
    window_slots,
)
from sgl_jax_rollout.engine.patches.hooks import current, wrap


def install() -> None:
    get = upstream.get
    scheduler = upstream.module("managers.scheduler")
    if not isinstance(scheduler.faulthandler, _SchedulerFaultHandler):
        scheduler.faulthandler = _SchedulerFaultHandler()
    wrap(get("NativeAttention"), "__call__", _native_attention)
    wrap(get("ModelRunner"), "init_attention_backend", _paged_native_attention_chosen)
    swa_pool = get("SWAKVPool")
    if not hasattr(swa_pool, "set_kv_buffer_legacy"):
        swa_pool.set_kv_buffer_legacy = _swa_set_kv_buffer_legacy
    wrap(swa_pool, "tree_flatten", _window_mapping_copied)
    wrap(get("ModelRunner"), "init_memory_pool", _no_window_mapping_on_native_attention)
    native = upstream.module("layers.attention.native_backend")
    if not isinstance(native.jnp, _ScoreCappingNumpy):
        native.jnp = _ScoreCappingNumpy()
    wrap(native, "forward_attention", _unpadded_heads)
    wrap(get("Llama3RotaryEmbedding"), "__init__", _llama3_scaled_frequencies)
    wrap(get("ScheduleBatch"), "_merge_cache_loc", _cache_loc_copied)
    wrap(get("ModelRunner"), "initialize_jit", _typed_sampler_key)
    wrap(get("ModelRunner"), "get_available_device_memory", _host_memory_unchecked_on_cpu)
    wrap(get("LoRAManager"), "__init__", _lora_manager_on_text_config)
    wrap(get("LoRAManager"), "init_memory_pool", _lora_buffers_per_layer)
    wrap(upstream.module("layers.moe"), "gmm", _experts_matmul_off_tpu)


def _llama3_scaled_frequencies(original, self, *args, **kwargs):
    """llama3_rope_scaling: the phases read `_inv_freq_np`; give it the scaled frequencies
    (upstream's own `_compute_inv_freq`, evaluated eagerly even inside a model-building trace)."""
    original(self, *args, **kwargs)
    with jax.ensure_compile_time_eval():
        self._inv_freq_np = np.asarray(self._compute_inv_freq(self.base), np.float32)


def _native_attention(original, self, q, k, v, layer, forward_batch, token_to_kv_pool, **kwargs):
    """paged_native_attention where the engine chose it (the backend is marked `paged`); else
    native_attention_per_rank, attention_logit_cap and swa_pool_native_attention, on upstream's
    CPU attention."""
    if getattr(self, "paged", False):
        args = (self, q, k, v, layer, forward_batch, token_to_kv_pool)
        numerics = getattr(current(), "numerics", None)
        return paged_native_attention(
            *args,
            round_weights=bool(numerics and numerics.attention_weights),
            softmax_in_dtype=bool(numerics and numerics.softmax_in_dtype),
            **kwargs,
        )
    if isinstance(token_to_kv_pool, upstream.get("SWAKVPool")):
        if self.mesh.shape.get("data", 1) > 1:
            raise NotImplementedError(
                "dp_size > 1 on the native attention backend with a sliding-window KV pool "
                "(models whose windowed layers have their own KV shape, Gemma 4)"
            )
        forward_batch = swa_cache_loc(forward_batch, token_to_kv_pool, layer.layer_id)
    args = (self, q, k, v, layer, forward_batch, token_to_kv_pool)
    cap = getattr(layer, "logit_cap", None)
    if not cap:
        return per_rank_native_attention(original, *args, **kwargs)
    scale = layer.scaling if layer.scaling is not None else 1.0 / float(layer.head_dim) ** 0.5
    token = _SCORE_CAP.set((float(cap), float(scale)))
    try:
        return per_rank_native_attention(original, *args, **kwargs)
    finally:
        _SCORE_CAP.reset(token)


def _paged_native_attention_chosen(original, self, *args, **kwargs):
    """paged_native_attention: a native backend built for an engine whose `native_attention`
    is "paged" is marked `paged` (static: part of every traced forward's key)."""
    out = original(self, *args, **kwargs)
    backend = self.attn_backend
    if isinstance(backend, upstream.get("NativeAttention")) and _paged_chosen():
        backend.paged = True
    return out


def _paged_chosen() -> bool:
    hooks = current()
    return hooks is not None and hooks.native_attention == "paged"


def swa_cache_loc(forward_batch: Any, pool: Any, layer_id: int) -> Any:
    """swa_pool_native_attention, the read: `forward_batch` with `cache_loc` (the slots the
    layer attends over, in the full pool's slot space) in the slot space of the pool that
    holds layer `layer_id`, as the flash backend remaps them (`flashattention_backend.py:
    646-647`)."""
    if not pool.layers_mapping[layer_id][1]:
        return forward_batch
    return dataclasses.replace(forward_batch, cache_loc=window_slots(pool, forward_batch.cache_loc))


def _window_mapping_copied(original, self):
    """swa_mapping_copied: on CPU, the pool's pytree children carry a copy of the host's
    full-to-window slot mapping, not the array itself. Upstream flattens its allocator's own
    numpy array into every forward's arguments (`memory_pool.py:825-838`, the array shared
    with `SWATokenToKVPoolAllocator`, `allocator.py:468`), which JAX's CPU client may alias
    (zero-copy, as `cache_loc_copied` says): under overlap scheduling the scheduler's
    allocations and frees for step t + 1 reach step t's forward."""
    children, aux = original(self)
    if jax.default_backend() != "cpu":
        return children, aux
    return tuple(np.array(c) if isinstance(c, np.ndarray) else c for c in children), aux


def _no_window_mapping_on_native_attention(original, self, *args, **kwargs):
    """swa_mapping_not_static: upstream's hybrid-pool setup hands the attention backend the
    allocator's slot mapping (`model_runner_kv_cache_mixin.py:823-828`, for the flash
    backend). The native backend is an nnx pytree that never reads it, where a numpy attribute
    becomes static metadata: the second engine of a process then failed at its first step
    (JAX compares a cached call's metadata, and two arrays have no truth value)."""
    out = original(self, *args, **kwargs)
    backend = self.attn_backend
    if isinstance(backend, upstream.get("NativeAttention")) and "swa_index_mapping" in vars(
        backend
    ):
        object.__delattr__(backend, "swa_index_mapping")
    return out


def _lora_manager_on_text_config(original, self, *args, **kwargs):
    """lora_text_config: the LoRA manager reads the language model's config. Upstream hands it
    the checkpoint's top-level config (`model_runner.py:1031-1033`) and reads the layer count,
    hidden size and heads at its top (`lora_manager.py:103-112`), which a multimodal
    checkpoint (Gemma 4) nests under `text_config`: the engine failed at start."""
    model_config = kwargs.get("model_config")
    text_config = getattr(model_config, "hf_text_config", None)
    if text_config is not None and "base_hf_config" in kwargs:
        kwargs["base_hf_config"] = text_config
    return original(self, *args, **kwargs)


def _lora_buffers_per_layer(original, self, *args, **kwargs):
    """lora_buffers_per_layer: each layer's LoRA buffers take the shape of the layer they adapt.
    Upstream sizes every layer's buffers from one head_dim and one KV head count
    (`lora_memory_pool.py:232-294`), while a Gemma 4 full-attention layer has twice the
    head_dim and a quarter of the KV heads of a windowed one: its adapters could not be added.
    A buffer whose shape differs from its base layer's kernel (`[in, out]`: A
    `(loras, rank, in)`, B `(loras, out, rank)`) is made again in zeros with that shape, dtype
    and sharding, before upstream hands the buffers to the layers (`update_lora_info`)."""
    out = original(self, *args, **kwargs)
    pool = self.memory_pool
    get_target = upstream.get("get_target_module_name")
    for layer_id, modules in enumerate(self.lora_modules):
        for name, module in modules.items():
            fan_in, fan_out = module.base_layer.weight.value.shape
            target = get_target(name, pool.target_modules)
            for buffers, shape in (
                (pool.A_buffer[target], (pool.max_loras_per_batch, pool.max_lora_rank, fan_in)),
                (pool.B_buffer[target], (pool.max_loras_per_batch, fan_out, pool.max_lora_rank)),
            ):
                old = buffers[layer_id]
                if old.shape != shape:
                    buffers[layer_id] = jax.jit(
                        lambda shape=shape, dtype=old.dtype: jnp.zeros(shape, dtype),
                        out_shardings=old.sharding,
                    )()
    return out


def _swa_set_kv_buffer_legacy(self, layer_id: int, loc, cache_k, cache_v):
    """swa_pool_native_attention, the write: `SWAKVPool.set_kv_buffer_legacy`, which the native
    backend calls (`native_backend.py:143`) and upstream's `SWAKVPool` lacks
    (`memory_pool.py:768`): the layer's sub-pool writes, at the slots `set_kv_buffer` would
    use (a windowed layer's in the window pool's slot space, `window_slots`). Returns the
    layer's updated fused buffer, which the model hands back to the pool's `replace_buffer` as
    for a plain pool."""
    pool_layer, is_swa = self.layers_mapping[layer_id]
    pool = self.swa_kv_pool if is_swa else self.full_kv_pool
    if is_swa:
        loc = window_slots(self, loc)
    return pool.set_kv_buffer_legacy(pool.start_layer + pool_layer, loc, cache_k, cache_v)


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


def _host_memory_unchecked_on_cpu(original, self):
    """cpu_memory_balance: on the CPU device, the free memory the engine sizes itself by is the
    minimum over every process (upstream's own `get_available_device_memory`, distributed
    where there are several), without upstream's tensor-parallel balance check
    (`model_runner.py:477-498`: that minimum below 0.9 x this process's reading raises). On CPU
    each reading is the host's free RAM (`psutil.virtual_memory().available`,
    `utils/jax_utils.py:192-197`), taken at another moment: processes sharing a host (`launch`,
    simulated hosts) failed their start at random when one allocated between two reads (seen:
    11.1 GB against 13.1 GB). Other devices keep upstream's check."""
    if self.device != "cpu":
        return original(self)
    return upstream.get("get_available_device_memory")(
        self.device,
        distributed=jax.process_count() != 1,
        device_indexes=self.server_args.device_indexes,
    )


# gmm's arguments that `grouped_matmul` does not serve: with any of them set, upstream's gmm runs
_GMM_EXTRAS = ("rhs_scale", "rhs_bias", "existing_out", "activation_quantized_dtype", "tiling")


def _experts_matmul_off_tpu(original, lhs, rhs, group_sizes, **kwargs):
    """experts_matmul_off_tpu: where upstream's gmm would run its Pallas kernel interpreted
    (off TPU, or `interpret=True`), the MoE layer's grouped matmul is `grouped_matmul` (row
    tiles times their experts' weights), for weights without scales or bias; quantized
    experts keep upstream's."""
    interpret = kwargs.get("interpret")
    if interpret is None:
        interpret = not upstream.get("is_tpu_runtime")()
    if not interpret or any(kwargs.get(name) is not None for name in _GMM_EXTRAS):
        return original(lhs, rhs, group_sizes, **kwargs)
    offset = kwargs.get("group_offset")
    return grouped_matmul(
        lhs,
        rhs,
        group_sizes,
        jnp.zeros((), jnp.int32) if offset is None else offset,
        kwargs.get("preferred_element_type", jnp.float32),
    )
