"""How the sampler reads the vocabulary: whole on one device, or sharded over a mesh axis.

Owns `Vocab`: the vocabulary's global size and, under tensor parallelism, the mesh axis its
logits are split over (inside `shard_map`, each device holds the columns
`[offset, offset + local)` of every row). Every stage of the sampler reads the vocabulary
through it, so the single-device sampler and the vocabulary-parallel one are the same code:
- reductions over the vocabulary (`sum`, `max`) are a local pass, then a collective on the
  per-row results (`[batch]` or `[batch, small]`), never on `[batch, vocab]`;
- `top_k` is a local exact top-k (`blocked_top_k`), then a top-k over the `shards * k`
  gathered candidates;
- `take` reads one id per row: the shard that owns it answers, the others add 0;
- `gather` collects one `[batch, small]` array from every shard, in shard order.
Without an axis each is the identity (or the plain local operation) and the offset is 0.

Must not decide what is kept or drawn: the stages do, through these.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

# Block width of `blocked_top_k`: a row's block maxima, then its k best blocks, are searched
# instead of the whole row (on CPU: 3.6 ms instead of 11.5 for 64 x 151,936 at k = 65).
TOP_K_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class Vocab:
    """The vocabulary of a sampler call: `size` ids in all; `axis` is the mesh axis the
    logits' columns are split over (None: this device holds all of them)."""

    size: int
    axis: str | None = None

    def shard(self) -> Int[Array, ""] | int:
        """This device's position along the axis (0 when the vocabulary is whole)."""
        return 0 if self.axis is None else lax.axis_index(self.axis)

    def offset(self, local_size: int) -> Int[Array, ""] | int:
        """Global id of this device's first column."""
        return self.shard() * local_size

    def ids(self, local_size: int) -> Int[Array, " local"]:
        """Global ids of this device's columns."""
        return self.offset(local_size) + jnp.arange(local_size, dtype=jnp.int32)

    def sum(self, x):
        """Sum over the shards of per-shard partial sums (a pytree of `[batch]` arrays)."""
        return x if self.axis is None else lax.psum(x, self.axis)

    def max(self, x: Float[Array, " batch"]) -> Float[Array, " batch"]:
        return x if self.axis is None else lax.pmax(x, self.axis)

    def gather(self, x: Array) -> Array:
        """`[batch, n]` from every shard, concatenated in shard order: `[batch, shards * n]`."""
        return x if self.axis is None else lax.all_gather(x, self.axis, axis=1, tiled=True)

    def take(self, values: Float[Array, "batch local"], ids: Int[Array, " batch"]) -> Array:
        """`values[r, ids[r]]` for global ids (each in range): read by the owning shard."""
        local = ids - self.offset(values.shape[1])
        owned = (local >= 0) & (local < values.shape[1])
        value = jnp.take_along_axis(values, jnp.clip(local, 0, values.shape[1] - 1)[:, None], 1)
        if self.axis is None:
            return value[:, 0]
        return lax.psum(jnp.where(owned, value[:, 0], 0), self.axis)

    def top_k(
        self, x: Float[Array, "batch local"], k: int
    ) -> tuple[Float[Array, "batch k"], Int[Array, "batch k"]]:
        """The k largest values of each row over the whole vocabulary and their global ids,
        descending, ties in id order (as `lax.top_k` over the unsharded row)."""
        local = x.shape[1]
        values, ids = blocked_top_k(x, min(k, local))
        if self.axis is None:
            return values, ids
        ids = ids + self.offset(local)
        values, position = _top_k(self.gather(values), k)
        return values, jnp.take_along_axis(self.gather(ids), position, axis=1)


def blocked_top_k(
    x: Float[Array, "batch n"], k: int
) -> tuple[Float[Array, "batch k"], Int[Array, "batch k"]]:
    """Exact `lax.top_k(x, k)` (ties in index order) through the row's blocks: each block's
    maximum, the k blocks with the largest maxima (every top-k value lies in one of them),
    then a top-k over those blocks taken in index order."""
    rows, n = x.shape
    blocks = -(-n // TOP_K_BLOCK)
    if blocks <= k:
        return _top_k(x, k)
    padded = blocks * TOP_K_BLOCK
    if padded != n:
        x = jnp.pad(x, ((0, 0), (0, padded - n)), constant_values=-jnp.inf)
    by_block = x.reshape(rows, blocks, TOP_K_BLOCK)
    _, best = _top_k(by_block.max(-1), k)
    best = jnp.sort(best, axis=-1)  # index order, so ties resolve as over the whole row
    inside = jnp.take_along_axis(by_block, best[:, :, None], axis=1).reshape(rows, -1)
    values, position = _top_k(inside, k)
    block = jnp.take_along_axis(best, position // TOP_K_BLOCK, axis=1)
    return values, (block * TOP_K_BLOCK + position % TOP_K_BLOCK).astype(jnp.int32)


def _top_k(x: Array, k: int) -> tuple[Array, Array]:
    """`lax.top_k` behind barriers: they keep XLA from folding later gathers into the sort
    that top-k lowers to; folded, the sort is not rewritten into the TopK kernel and the whole
    row gets sorted (seen on CPU: 30 ms per row instead of 0.2). One barrier per output: a
    single barrier over the (values, ids) pair crashes XLA's CPU TopK decomposer when the
    engine shards over a tensor axis (jax 0.10.2, tp = 2)."""
    values, ids = lax.top_k(x, k)
    return lax.optimization_barrier(values), lax.optimization_barrier(ids)
