"""Drawing a token from a kept set with one uniform number per row (step 5).

Owns inverse-CDF sampling: over the candidates when the kept set fits in them, and over the
full vocabulary otherwise (shard masses, block sums, then one block: one pass over the
vocabulary for the masses, one over the chosen block). Either way a row uses
one uniform from its own key, so a seeded row draws the same token whatever the batch.
The full-vocabulary pass also returns the kept mass and entropy numerator, so the
processed logprob and entropy of such rows cost no extra pass. Also owns `Drawn`, step 5's
result (the token and the masses the outputs reuse), and `take`, the per-row lookup both
the draw and the outputs use.

Must not decide the kept set.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, UInt32

from sgl_jax_rollout.sampling.batch import KEY_IMPL
from sgl_jax_rollout.sampling.distribution import moment_given_mass
from sgl_jax_rollout.sampling.vocab import Vocab

# Largest block of the two-level draw that is searched for an exact divisor of the vocabulary.
_MAX_BLOCK = 4096


def row_uniforms(keys: UInt32[Array, "batch 2"]) -> Float[Array, " batch"]:
    """One U[0, 1) number per row from its `KEY_IMPL` key data."""
    return jax.vmap(lambda k: jax.random.uniform(jax.random.wrap_key_data(k, impl=KEY_IMPL)))(keys)


def inverse_cdf(
    weights: Float[Array, "batch n"], target: Float[Array, " batch"]
) -> Int[Array, " batch"]:
    """First index whose cumulative weight exceeds `target`; rounding past the end falls
    back to the last positive weight, so the index always has weight > 0 (if any does)."""
    n = weights.shape[1]
    index = jnp.sum(jnp.cumsum(weights, axis=-1) <= target[:, None], axis=-1)
    last_positive = n - 1 - jnp.argmax(weights[:, ::-1] > 0, axis=-1)
    return jnp.minimum(index, last_positive).astype(jnp.int32)


def draw_from_vocab(
    logits: Float[Array, "batch vocab"],
    inv_temperature: Float[Array, " batch"],
    top: Float[Array, " batch"],
    threshold: Float[Array, " batch"],
    uniform: Float[Array, " batch"],
    with_moment: bool,
    vocab: Vocab,
) -> tuple[Int[Array, " batch"], Float[Array, " batch"], Float[Array, " batch"] | None]:
    """Samples from exp(t - top), t = logits * inv_temperature, restricted to t >= threshold.

    Returns the token, the kept mass S and (when `with_moment`) sum w (t - top) over the kept
    set, for the processed entropy `log S - moment / S`. Tempered values are recomputed
    inside each fused pass rather than stored. Inverse CDF on three levels: the shards' kept
    masses (one `[batch, shards]` gather; a single level of one shard when the vocabulary is
    whole), the blocks of the chosen shard, then one block; every shard runs the last two on
    its own columns and the chosen shard's token is kept.
    """
    rows, local = logits.shape
    block = _block_size(local)
    padded = -(-local // block) * block
    columns = logits
    if padded != local:
        columns = jnp.pad(logits, ((0, 0), (0, padded - local)), constant_values=-jnp.inf)

    def kept(values: Float[Array, "batch n"]) -> Float[Array, "batch n"]:
        t = values * inv_temperature[:, None]
        return jnp.where(t >= threshold[:, None], t, -jnp.inf)

    block_mass = jnp.exp(kept(columns) - top[:, None]).reshape(rows, -1, block).sum(-1)
    local_mass = block_mass.sum(-1)
    moment = vocab.sum(moment_given_mass(kept(logits), top, local_mass)) if with_moment else None
    shard_mass = vocab.gather(local_mass[:, None])
    mass = shard_mass.sum(-1)
    target = uniform * mass
    shard = inverse_cdf(shard_mass, target)
    target = target - _mass_before(shard_mass, shard)
    block_index = inverse_cdf(block_mass, target)
    target = target - _mass_before(block_mass, block_index)
    inside = jax.vmap(lambda row, b: jax.lax.dynamic_slice(row, (b * block,), (block,)))(
        columns, block_index
    )
    column = block_index * block + inverse_cdf(jnp.exp(kept(inside) - top[:, None]), target)
    token = vocab.sum(jnp.where(vocab.shard() == shard, vocab.offset(local) + column, 0))
    return token, mass, moment


def _mass_before(masses: Float[Array, "batch n"], index: Int[Array, " batch"]) -> Array:
    """Mass of the entries before `index` in each row."""
    before = jnp.cumsum(masses, -1) - masses
    return jnp.take_along_axis(before, index[:, None], 1)[:, 0]


def _block_size(vocab: int) -> int:
    """A divisor of a shard's columns near its square root (no padding), else the square root."""
    root = math.isqrt(vocab - 1) + 1
    for size in range(root, min(vocab, _MAX_BLOCK) + 1):
        if vocab % size == 0:
            return size
    return root


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Drawn:
    """Step 5's result and the masses the outputs reuse."""

    tokens: Int[Array, " batch"]
    from_candidates: Bool[Array, " batch"]  # drawn among the candidates (else over the vocab)
    cand_pos: Int[Array, " batch"]  # position of the draw among the candidates
    cand_weights: Float[Array, "batch c"]  # kept candidates' exp(t - top), 0 elsewhere
    cand_mass: Float[Array, " batch"]
    vocab_threshold: Float[Array, " batch"]  # threshold, -inf for greedy rows
    vocab_mass: Float[Array, " batch"]  # kept mass over the vocab (0 where not computed)
    vocab_moment: Float[Array, " batch"] | None  # for the processed full entropy only


def take(values: Array, index: Array) -> Array:
    """`values[r, index[r]]` for every row r (indices in range by construction; unlike
    truncation's clipped lookup, nothing is clamped)."""
    return jnp.take_along_axis(values, index[:, None].astype(jnp.int32), axis=1)[:, 0]
