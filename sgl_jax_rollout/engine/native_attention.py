"""The `paged_native_attention` patch's body: sgl-jax's native attention backend (the one it
runs on CPU and GPU) served by `paged_attention.py`.

Owns `paged_native_attention` (what `NativeAttention.__call__` runs when the engine's
`native_attention` setting is "paged", `patches/upstream_fixes.py`) and `window_slots`, the
slot translation of the sliding-window pool (used by the upstream path's fixes too).
Checked against sgl-project/sglang-jax cddbf6f1 (`layers/attention/native_backend.py`
`NativeAttention.__call__`, `mem_cache/memory_pool.py` `merge_kv` and `SWAKVPool`).

Per data-parallel rank and tensor shard (`shard_map` over the backend's mesh, as the
flash-attention backend runs its kernel): the layer's new K / V written into its fused buffer
at `out_cache_loc` (upstream `merge_kv`, then a scatter XLA does in place on the donated
pools), then decode or extend attention over each request's own slots. A windowed layer of
the hybrid pool (Gemma 4) writes and reads the window pool's slots (`window_slots`). Returns
the attention output and the layer's updated buffer, as upstream's `__call__` does.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Int

from sgl_jax_rollout.engine import paged_attention, upstream
from sgl_jax_rollout.engine.dp_attention import DATA, TENSOR, per_head


def paged_native_attention(
    backend: Any,
    q,
    k,
    v,
    layer: Any,
    forward_batch: Any,
    pool: Any,
    round_weights: bool = False,
    softmax_in_dtype: bool = False,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """`NativeAttention.__call__` on the paged attention: the layer's output `[tokens,
    heads * head_dim]` and its updated fused KV buffer. `round_weights`: a narrower-than-float32
    model's attention weights are normalised, then rounded to its dtype before the value
    product (`ScoreOptions.round_weights`); `softmax_in_dtype`: its softmax computed in its
    dtype step by step (`ScoreOptions.softmax_in`)."""
    forward_mode = upstream.get("ForwardMode")
    mode = forward_batch.forward_mode
    decode = mode == forward_mode.DECODE
    if not (decode or mode.is_extend()):
        raise NotImplementedError(
            f"the paged native attention serves extend and decode, not {mode}"
        )
    head_dim = layer.head_dim
    causal = not decode and layer.attn_type != upstream.get("AttentionType").ENCODER_ONLY
    scale = layer.scaling if layer.scaling is not None else 1.0 / float(head_dim) ** 0.5
    sink = kwargs.get("attention_sink")
    sink = getattr(sink, "value", sink)
    out_loc, cache_loc = forward_batch.out_cache_loc, forward_batch.cache_loc
    data = backend.mesh.shape.get(DATA, 1)
    if isinstance(pool, upstream.get("SWAKVPool")) and pool.layers_mapping[layer.layer_id][1]:
        if data > 1:
            raise NotImplementedError(
                "dp_size > 1 on the native attention backend with a sliding-window KV pool "
                "(models whose windowed layers have their own KV shape, Gemma 4)"
            )
        out_loc, cache_loc = window_slots(pool, out_loc), window_slots(pool, cache_loc)
    fused = pool.get_fused_kv_buffer(layer.layer_id)
    narrow = jnp.finfo(q.dtype).bits < 32
    options = paged_attention.ScoreOptions(
        scale=scale,
        logit_cap=getattr(layer, "logit_cap", None) or None,
        window=layer.sliding_window_size,
        softmax_dtype=layer.softmax_dtype,
        temperature_len=getattr(layer, "xai_temperature_len", None),
        round_weights=q.dtype if round_weights and narrow else None,
        softmax_in=q.dtype if softmax_in_dtype and narrow else None,
    )
    zeros = jnp.zeros_like(forward_batch.seq_lens)
    return _layer(
        per_head(q, head_dim),
        per_head(k, head_dim),
        per_head(v, head_dim),
        fused,
        out_loc,
        forward_batch.seq_lens,
        cache_loc,
        zeros if decode else forward_batch.extend_prefix_lens,
        zeros if decode else forward_batch.extend_seq_lens,
        () if sink is None else (sink,),
        mesh=backend.mesh,
        page_size=fused.shape[1],
        options=options,
        decode=decode,
        causal=causal,
    )


@functools.partial(jax.jit, static_argnames=("mesh", "page_size", "options", "decode", "causal"))
def _layer(
    q,
    k,
    v,
    fused,
    out_loc,
    seq_lens,
    cache_loc,
    prefix,
    extend,
    sinks,
    *,
    mesh,
    page_size,
    options,
    decode,
    causal,
):
    """One layer's write and attention, per dp rank and tensor shard. Jitted with its static
    settings so that a model's layers of one shape are traced and lowered once per forward
    (30 traces of the same attention were a third of a warm engine start's tracing)."""
    common = dict(page_size=page_size, options=options)
    merge_kv = upstream.get("merge_kv")

    def rank(q, k, v, fused, out_loc, seq_lens, cache_loc, prefix, extend, *sink):
        new = merge_kv(k, v)
        fused = paged_attention.write_kv(
            fused, out_loc, new.reshape(new.shape[0], -1, new.shape[-1])
        )
        sink = sink[0] if sink else None
        if decode:
            out = paged_attention.decode_attention(
                q, fused, cache_loc, seq_lens, sink=sink, **common
            )
        else:
            out = paged_attention.extend_attention(
                q, fused, cache_loc, seq_lens, prefix, extend, causal=causal, sink=sink, **common
            )
        return out.reshape(q.shape[0], -1), fused

    rows = P(DATA)
    heads = P(DATA, TENSOR)
    return jax.shard_map(
        rank,
        mesh=mesh,
        in_specs=(
            *(heads, heads, heads, P(DATA, None, TENSOR, None, None)),
            *[rows] * 5,
            *[P(TENSOR)] * len(sinks),  # per query head, split as the heads are
        ),
        out_specs=(heads, P(DATA, None, TENSOR, None, None)),
        check_vma=False,
    )(q, k, v, fused, out_loc, seq_lens, cache_loc, prefix, extend, *sinks)


def window_slots(pool: Any, loc: Int[Array, " tokens"]) -> Int[Array, " tokens"]:
    """Full-pool slots `loc` in the sliding-window sub-pool's slot space: upstream's
    `SWAKVPool._remap_swa_loc` (dp 1), with the host mapping replicated on the pool's mesh
    (upstream indexes it as an array of no mesh, which fails beside `loc` sharded over the
    explicit mesh's "data" axis) and negative (padding) slots kept, to be dropped."""
    everywhere = NamedSharding(pool.swa_kv_pool.mesh, P())  # the traced pool keeps no mesh
    mapping = jax.sharding.reshard(jnp.asarray(pool.full_to_swa_index_mapping), everywhere)
    replicated = jax.sharding.reshard(loc, everywhere)
    slots = mapping[jnp.maximum(replicated, 0)].astype(loc.dtype)
    return jax.sharding.reshard(
        jnp.where(replicated < 0, replicated, slots), jax.typeof(loc).sharding
    )
