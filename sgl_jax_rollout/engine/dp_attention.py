"""Data parallelism for sgl-jax's native attention backend (the one sgl-jax uses on CPU).

Owns `per_rank_native_attention` (the body of the `native_attention_per_rank` patch,
`patches/upstream_fixes.py`), `rank_kv_update`, and the mesh axis names and `per_head` reshape
that `native_attention.py` shares. Checked against sgl-project/sglang-jax cddbf6f1
(`layers/attention/native_backend.py`, `NativeAttention.__call__` and
`_get_and_update_kv_cache`).

With `dp_size > 1` the scheduler lays the batch out per dp rank (fixed-size sections of
tokens, `seq_lens`, `cache_loc`), each rank's KV allocator hands out slot ids local to its
shard of the KV cache (sharded over "data"), and the flash-attention backend runs its kernel
per rank under `shard_map`. Upstream's native backend treats all of it as one global batch:
rank 1's keys overwrite rank 0's slots and its queries attend to the wrong keys (wrong tokens
on CPU whenever a dp > 1 batch holds requests on two ranks). This runs the same KV write
(`rank_kv_update`: upstream `merge_kv`, scattered at `out_cache_loc`) and upstream
`forward_attention`, unchanged, on each rank's shard under `shard_map`, as the
flash-attention backend does. With one dp rank the upstream call runs as is.

Why the KV write is not upstream's call: `MHATokenToKVPool.set_kv_buffer_legacy`
(`mem_cache/memory_pool.py:716`) reads the pool's global buffer list and reshapes with explicit
`out_sharding` over the global mesh, neither of which exists inside `shard_map` on one rank's
shard. `rank_kv_update` does its scatter on the local shard with upstream's own `merge_kv` and
the fused layout upstream's native backend reads (`_get_and_update_kv_cache`: K at even, V at
odd head slots); tests/sgl_jax_rollout/engine/test_dp_attention.py compares it with upstream's
write and split, so a change of that layout fails there. `forward_attention` is upstream's,
called by keyword (its parameters are checked at start by `upstream.check`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from sgl_jax_rollout.engine import upstream

DATA, TENSOR = "data", "tensor"


def per_rank_native_attention(
    original, self, q, k, v, layer, forward_batch, token_to_kv_pool, **kwargs
) -> tuple[jax.Array, jax.Array]:
    if self.mesh.shape.get(DATA, 1) == 1:
        return original(self, q, k, v, layer, forward_batch, token_to_kv_pool, **kwargs)
    forward_attention = upstream.get("forward_attention")
    attention_type, forward_mode = upstream.get("AttentionType"), upstream.get("ForwardMode")
    if kwargs.get("attention_sink") is not None:
        raise NotImplementedError(
            "dp_size > 1 on the native attention backend: models with attention sinks are "
            "not supported"
        )
    head_dim = layer.head_dim
    mode = forward_batch.forward_mode
    causal = not (mode == forward_mode.DECODE or layer.attn_type == attention_type.ENCODER_ONLY)
    scale = 1.0 / jnp.sqrt(head_dim) if layer.scaling is None else layer.scaling
    no_extend = jnp.zeros_like(forward_batch.seq_lens)
    prefix = forward_batch.extend_prefix_lens if mode.is_extend() else no_extend
    extend = forward_batch.extend_seq_lens if mode.is_extend() else no_extend

    def rank(q, k, v, fused, out_loc, seq_lens, cache_loc, prefix, extend):
        k_cache, v_cache, fused = rank_kv_update(fused, out_loc, k, v)
        out = forward_attention(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            seq_lengths=seq_lens,
            loc=cache_loc,
            extend_prefix_lens=prefix,
            extend_seq_lens=extend,
            num_heads=q.shape[1],
            num_kv_heads=k.shape[1],
            scale=scale,
            is_causal=causal,
            mode=mode,
            kv_sharding=None,
            mesh=jax.sharding.get_abstract_mesh(),
            xai_temperature_len=getattr(layer, "xai_temperature_len", None),
            sliding_window_size=layer.sliding_window_size,
            softmax_dtype=layer.softmax_dtype,
        )
        return out.reshape(q.shape[0], -1), fused

    rows = P(DATA)
    out, fused = jax.shard_map(
        rank,
        mesh=self.mesh,
        in_specs=(
            P(DATA, TENSOR),
            P(DATA, TENSOR),
            P(DATA, TENSOR),
            P(DATA, None, TENSOR, None, None),
            rows,
            rows,
            rows,
            rows,
            rows,
        ),
        out_specs=(P(DATA, TENSOR), P(DATA, None, TENSOR, None, None)),
        check_vma=False,
    )(
        per_head(q, head_dim),
        per_head(k, head_dim),
        per_head(v, head_dim),
        token_to_kv_pool.get_fused_kv_buffer(layer.layer_id),
        forward_batch.out_cache_loc,
        forward_batch.seq_lens,
        forward_batch.cache_loc,
        prefix,
        extend,
    )
    return out, fused


def rank_kv_update(
    fused: Float[Array, "pages page_size heads_per_pack packing head_dim"],
    out_loc: Int[Array, " tokens"],
    k: Float[Array, "tokens kv_heads head_dim"],
    v: Float[Array, "tokens kv_heads head_dim"],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One rank's KV write and read: `k` / `v` written at `out_loc` (-1: padding, dropped)
    into the fused buffer, as upstream's `set_kv_buffer_legacy` writes it; returns the K and V
    views `[slots, kv_heads, head_dim]` (as upstream's `_get_and_update_kv_cache` splits them)
    and the updated fused buffer."""
    pages, page_size, heads_per_pack, packing, dim = fused.shape
    cache = fused.reshape(pages * page_size, heads_per_pack * packing, dim)
    new = upstream.get("merge_kv")(k, v)
    new = new.reshape(new.shape[0], heads_per_pack * packing, dim)
    cache = cache.at[jnp.where(out_loc >= 0, out_loc, cache.shape[0])].set(
        new.astype(cache.dtype), mode="drop"
    )
    return cache[:, ::2], cache[:, 1::2], cache.reshape(fused.shape)


def per_head(x: Any, head_dim: int) -> jax.Array:
    """`[tokens, heads * head_dim]` (or already per head) as `[tokens, heads, head_dim]`."""
    return x.reshape(x.shape[0], -1, head_dim)
