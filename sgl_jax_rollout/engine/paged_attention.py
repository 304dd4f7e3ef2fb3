"""Attention over a paged KV cache that reads each request's own slots, in plain JAX.

Owns `ScoreOptions`, `write_kv` (the layer's KV write, a scatter into the fused buffer that
XLA does in place when the buffer is donated), `decode_attention`, `extend_attention`,
`extend_block` and `request_offsets`.
They work on one shard: the `paged_native_attention` patch (`native_attention.py`) runs them
per data-parallel rank and tensor shard under `shard_map`. Nothing here imports sgl-jax or
this project, so the module can be sent upstream as it is.

The layout they read is sgl-jax's (checked against sgl-project/sglang-jax cddbf6f1):
- the fused buffer `[pages, page_size, 2 * kv_heads / packing, packing, head_dim_padded]`,
  K of head h at flat head slot 2h and V at 2h + 1 (`mem_cache/memory_pool.py` `merge_kv`),
  head_dim padded to a multiple of 128;
- `cache_loc`, the KV slot of every token of every request, request after request, each
  request's run padded to a whole number of pages (`ScheduleBatch._merge_cache_loc`,
  `managers/schedule_batch.py:2428-2431`): request r's tokens start at `request_offsets`[r].
  Upstream's native backend reads them at `cumsum(seq_lens)`, right only for page_size 1.

Both modes run one computation, `_attend_own_slots`: blocks of queries, each block of one
request, attend over that request's own slots, gathered through `cache_loc` `chunk` keys at a
time (`KEY_CHUNK`) with an online softmax, in a loop over only the chunks some query of the
batch can see (its length is read from `seq_lens` at run time: one compiled program serves
every context length, and a step costs what its longest request holds, not the engine's
context). Decode: a block per row, one query each: `rows x longest` work, against upstream's
`rows x len(cache_loc)` (every row against every request's slots, masked). Extend: each
request's new tokens in blocks of `extend_block` (a request never shares a block), attending
causally to the request's prefix and to the new tokens before them; the blocks loop over
their keys `BLOCK_GROUP` at a time, each group over the keys its own queries see, and the
token bucket's padding blocks not at all: about `real tokens x (prefix + new tokens / 2)`
work per request, against upstream's `tokens x len(cache_loc)`, where `len(cache_loc)` is the
largest batch bucket's worth of requests (measured on CPU for one layer of two requests of
1,024 and 901 new tokens in a 4,096-token bucket: 4 to 5 times faster than all the blocks
looping together).
GQA groups query heads over their KV head (no repeat); sliding windows, attention soft-caps,
attention sinks, xai temperature scaling and a softmax dtype are served as upstream's native
backend serves them (the softmax's running max and sum in float32, or the softmax dtype when
wider). KV is never copied whole: the write is a scatter, the read a gather of
the slots a block needs, of the head_dim columns the model has (the pool pads to 128).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from sgl_jax_rollout.engine import chunked_softmax

# Keys read per step of the loop over a request's slots.
KEY_CHUNK = 32
# Query blocks of an extend that loop over their keys together (`_attend_in_groups`).
BLOCK_GROUP = 4


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
    """How a layer's scores become weights, as upstream's native backend computes them:
    `scale` times q.k, soft-capped at `logit_cap`, scaled by xai temperature past
    `temperature_len`, masked to the last `window` positions, softmax in `softmax_dtype`.
    `round_weights` (default None: upstream's, the weights kept unnormalised in float32 and
    the sum divided once at the end): the dtype each weight is rounded to once normalised,
    before the value product, as tunix's models round theirs (`softmax(...).astype(dtype)`);
    it costs a second pass over the keys. `softmax_in` (default None): the dtype the whole
    softmax is computed in, each step rounded to it as `jax.nn.softmax` on scores of that dtype
    computes (tunix's Gemma 2 / 3): the scores' max, `exp(score - max)`, their sum (accumulated
    in float32, then rounded) and each weight's division, the weights then multiplying the
    values; it costs three passes over the keys (the max, the sum, the values)."""

    scale: float
    logit_cap: float | None = None
    window: int | None = None
    softmax_dtype: Any = None
    temperature_len: float | None = None
    round_weights: Any = None
    softmax_in: Any = None


def request_offsets(seq_lens: Int[Array, " reqs"], page_size: int) -> Int[Array, " reqs"]:
    """Where each request's slots start in `cache_loc`: the exclusive sum of the requests'
    lengths, each rounded up to whole pages."""
    aligned = (seq_lens + page_size - 1) // page_size * page_size
    return jnp.cumsum(aligned) - aligned


def write_kv(
    fused: Float[Array, "pages page_size heads_per_pack packing dim"],
    out_loc: Int[Array, " tokens"],
    new: Float[Array, "tokens heads_x2 dim"],
) -> Float[Array, "pages page_size heads_per_pack packing dim"]:
    """`new` (K and V interleaved per head, as the buffer keeps them) written at token slots
    `out_loc` (negative: padding, dropped). Indexed by (page, offset) on the buffer's own
    shape: a scatter through a flattened view made XLA copy the whole buffer (measured on CPU:
    a temporary the size of the layer's cache, none this way)."""
    pages, page_size, heads_per_pack, packing, dim = fused.shape
    slots = jnp.where(out_loc >= 0, out_loc, pages * page_size)
    rows = new.reshape(new.shape[0], heads_per_pack, packing, dim).astype(fused.dtype)
    return fused.at[slots // page_size, slots % page_size].set(rows, mode="drop")


def _gather_kv(
    fused: Float[Array, "pages page_size heads_per_pack packing dim"],
    slots: Int[Array, "*dims"],
    head_dim: int,
) -> tuple[jax.Array, jax.Array]:
    """K and V `[*slots.shape, kv_heads, head_dim]` at `slots`: one gather, by (page, offset)
    on the buffer's own shape, of each slot's first `head_dim` columns (the pool pads head_dim
    to 128; the padding is never read), then split. Of the layouts measured on CPU for a
    decode step of 64 rows x 1,088 slots read in one piece (whole rows cut afterwards; K and
    V contracted interleaved; heads before slots), this one gave the fastest step."""
    pages, page_size, heads_per_pack, packing, dim = fused.shape
    index = jnp.stack([slots // page_size, slots % page_size], axis=-1)
    offset = tuple(range(slots.ndim, slots.ndim + 3))
    kv = jax.lax.gather(
        fused,
        index,
        jax.lax.GatherDimensionNumbers(
            offset_dims=offset, collapsed_slice_dims=(0, 1), start_index_map=(0, 1)
        ),
        slice_sizes=(1, 1, heads_per_pack, packing, head_dim),
        mode=jax.lax.GatherScatterMode.CLIP,
    )
    kv = kv.reshape(*slots.shape, heads_per_pack * packing // 2, 2, head_dim)
    return kv[..., 0, :], kv[..., 1, :]


def extend_block(tokens: int, reqs: int) -> int:
    """Queries per block in an extend of `tokens` (the token bucket) over `reqs` (the batch
    bucket): a power of two near `tokens / reqs`, at most 64, so that the blocks (at most
    `tokens / block + reqs`) hold at most twice the bucket's tokens."""
    block = 1
    while block < 64 and block * 2 <= tokens // max(reqs, 1):
        block *= 2
    return block


def decode_attention(
    q: Float[Array, "rows heads head_dim"],
    fused: Float[Array, "pages page_size heads_per_pack packing dim"],
    cache_loc: Int[Array, " slots"],
    seq_lens: Int[Array, " reqs"],
    *,
    page_size: int,
    chunk: int = KEY_CHUNK,
    options: ScoreOptions,
    sink: Float[Array, " heads"] | None = None,
) -> Float[Array, "rows heads head_dim"]:
    """One new token per request: row r attends to request r's first `seq_lens[r]` slots
    (its last `window` with a sliding window). Rows past the requests get zeros."""
    rows, heads, head_dim = q.shape
    n = min(rows, seq_lens.shape[0])
    lens = seq_lens[:n]
    out = _attend_own_slots(
        q[:n, None],
        (lens - 1)[:, None],
        jnp.ones((n, 1), bool),
        jnp.arange(n),
        fused,
        cache_loc,
        seq_lens,
        page_size=page_size,
        chunk=chunk,
        options=options,
        causal=True,
        sink=sink,
        temperature=_temperature_regulator(lens[:, None], options.temperature_len),
    )[:, 0]
    if n < rows:
        out = jnp.concatenate([out, jnp.zeros((rows - n, heads, head_dim), out.dtype)])
    return out


def extend_attention(
    q: Float[Array, "tokens heads head_dim"],
    fused: Float[Array, "pages page_size heads_per_pack packing dim"],
    cache_loc: Int[Array, " slots"],
    seq_lens: Int[Array, " reqs"],
    prefix_lens: Int[Array, " reqs"],
    extend_lens: Int[Array, " reqs"],
    *,
    page_size: int,
    chunk: int = KEY_CHUNK,
    options: ScoreOptions,
    causal: bool = True,
    sink: Float[Array, " heads"] | None = None,
) -> Float[Array, "tokens heads head_dim"]:
    """New tokens of several requests, packed request after request (`extend_lens`): each
    attends to its request's slots up to its own position (`prefix_lens` + its index among
    the request's new tokens), or to all of them when not `causal`. Tokens past the requests
    get zeros."""
    tokens, heads, head_dim = q.shape
    reqs = seq_lens.shape[0]
    size = extend_block(tokens, reqs)
    blocks = (extend_lens + size - 1) // size
    block_end = jnp.cumsum(blocks)
    block = jnp.arange(-(-tokens // size) + reqs)
    owner = jnp.searchsorted(block_end, block, side="right")
    real = owner < reqs
    owner = jnp.minimum(owner, reqs - 1)
    local = (block - (block_end - blocks)[owner])[:, None] * size + jnp.arange(size)
    q_valid = real[:, None] & (local < extend_lens[owner][:, None])
    token = jnp.where(
        q_valid, (jnp.cumsum(extend_lens) - extend_lens)[owner][:, None] + local, tokens
    )
    positions = prefix_lens[owner][:, None] + local
    out = _attend_in_groups(
        block_end[-1],
        q[jnp.minimum(token, tokens - 1)],
        positions,
        q_valid,
        owner,
        _temperature_regulator(positions, options.temperature_len),
        fused=fused,
        cache_loc=cache_loc,
        seq_lens=seq_lens,
        page_size=page_size,
        chunk=chunk,
        options=options,
        causal=causal,
        sink=sink,
    )
    placed = jnp.zeros((tokens, heads, head_dim), out.dtype)
    return placed.at[token.reshape(-1)].set(out.reshape(-1, heads, head_dim), mode="drop")


def _attend_in_groups(
    real_blocks: Int[Array, ""],
    q: Float[Array, "blocks size heads head_dim"],
    positions: Int[Array, "blocks size"],
    q_valid: Bool[Array, "blocks size"],
    owner: Int[Array, " blocks"],
    temperature: Float[Array, "blocks size"] | None,
    **attend: Any,
) -> Float[Array, "blocks size heads head_dim"]:
    """`_attend_own_slots` over the first `real_blocks` blocks only, `BLOCK_GROUP` at a time:
    each group loops over the keys its own queries see, so a step costs what its requests hold
    (a request's early blocks stop at their own positions; the token bucket's padding blocks
    cost nothing), not `blocks x longest`. Blocks past `real_blocks` get zeros, as
    `_attend_own_slots` gives them. Each query sees the same chunks in the same order either
    way (a chunk it cannot see leaves its softmax exactly as it was)."""
    blocks, size, heads, head_dim = q.shape
    group = min(BLOCK_GROUP, blocks)
    padded = -(-blocks // group) * group

    def pad(array: jax.Array, value: Any) -> jax.Array:
        width = [(0, padded - blocks)] + [(0, 0)] * (array.ndim - 1)
        return jnp.pad(array, width, constant_values=value)

    inputs = (pad(q, 0), pad(positions, 0), pad(q_valid, False), pad(owner, 0))
    if temperature is not None:
        inputs += (pad(temperature, 1.0),)

    def body(g: jax.Array, out: jax.Array) -> jax.Array:
        part = [jax.lax.dynamic_slice_in_dim(a, g * group, group) for a in inputs]
        attended = _attend_own_slots(
            *part[:4], temperature=part[4] if temperature is not None else None, **attend
        )
        return jax.lax.dynamic_update_slice_in_dim(out, attended, g * group, 0)

    out = jnp.zeros((padded, size, heads, head_dim), q.dtype)
    out = jax.lax.fori_loop(0, (real_blocks + group - 1) // group, body, out)
    return out[:blocks]


def _attend_own_slots(
    q: Float[Array, "blocks size heads head_dim"],
    positions: Int[Array, "blocks size"],
    q_valid: Bool[Array, "blocks size"],
    owner: Int[Array, " blocks"],
    fused: Float[Array, "pages page_size heads_per_pack packing dim"],
    cache_loc: Int[Array, " slots"],
    seq_lens: Int[Array, " reqs"],
    *,
    page_size: int,
    chunk: int,
    options: ScoreOptions,
    causal: bool,
    sink: Float[Array, " heads"] | None,
    temperature: Float[Array, "blocks size"] | None,
) -> Float[Array, "blocks size heads head_dim"]:
    """Each block's queries (of request `owner`) over the request's slots: key j is seen by a
    query at `positions` p when j < the request's length, j <= p when `causal`, and
    p - j < window with a window (upstream's masks). Keys are read `chunk` at a time, only
    the chunks some query of the batch sees (a loop of dynamic length, online softmax with
    float32 statistics); a query that sees no key gets zeros."""
    blocks, size, heads, head_dim = q.shape
    kv_heads = fused.shape[2] * fused.shape[3] // 2
    group = heads // kv_heads
    start = request_offsets(seq_lens, page_size)[owner][:, None]
    lens = seq_lens[owner][:, None]
    grouped = q.reshape(blocks, size, kv_heads, group, head_dim)
    # the keys each query can see: [first, end)
    end = jnp.minimum(lens, positions + 1) if causal else jnp.broadcast_to(lens, positions.shape)
    first = jnp.maximum(positions - options.window + 1, 0) if options.window is not None else 0
    sees = q_valid & (end > first)
    keys_end = jnp.max(jnp.where(sees, end, 0))
    keys_start = jnp.min(jnp.where(sees, first, keys_end))
    stat = jnp.promote_types(options.softmax_dtype or q.dtype, jnp.float32)
    neg = jnp.finfo(stat).min

    def chunk_scores(i):
        """Chunk i's scores `[blocks, kv, group, size, chunk]` in `stat` (unseen keys at
        `neg`), which keys each query sees, and the chunk's values."""
        keys = i * chunk + jnp.arange(chunk)
        index = jnp.minimum(start + keys, cache_loc.shape[0] - 1)
        k, v = _gather_kv(fused, cache_loc[index], head_dim)  # [blocks, chunk, kv, head_dim]
        seen = (keys < lens)[:, None, :] & q_valid[:, :, None]
        if causal:
            seen = seen & (keys <= positions[:, :, None])
        if options.window is not None:
            seen = seen & (positions[:, :, None] - keys < options.window)
        scores = jnp.einsum("nbkgd,nckd->nkgbc", grouped, k) * options.scale
        if options.logit_cap:
            scores = options.logit_cap * jnp.tanh(scores / options.logit_cap)
        if temperature is not None:
            scores = scores * temperature[:, None, None, :, None]
        if options.softmax_dtype is not None:
            scores = scores.astype(options.softmax_dtype)
        if options.softmax_in is not None:
            scores = scores.astype(options.softmax_in)
        seen = seen[:, None, None]
        return jnp.where(seen, scores.astype(stat), neg), seen, v

    shape = (blocks, kv_heads, group, size)
    loop = (keys_start // chunk, (keys_end + chunk - 1) // chunk)
    keys = chunked_softmax.Keys(chunk_scores, loop, shape, head_dim, stat, sink)
    if options.softmax_in is not None:
        out = chunked_softmax.softmax_in_dtype(keys, options.softmax_in)
    else:
        out = chunked_softmax.online_softmax(keys, options)
    return jnp.moveaxis(out, 3, 1).reshape(blocks, size, heads, head_dim).astype(q.dtype)


def _temperature_regulator(positions, temperature_len):
    """xai temperature scaling of the scores by query position, as upstream's native backend
    (`native_backend.py:262-283`)."""
    if not temperature_len or temperature_len <= 0:
        return None
    log_pos = jnp.log2(jnp.maximum(positions.astype(jnp.float32), 1.0))
    factor = log_pos / jnp.log2(float(temperature_len))
    return jnp.where(positions > temperature_len, factor, 1.0)
