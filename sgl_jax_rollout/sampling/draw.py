"""Drawing a token from a kept set with one uniform number per row (step 5).

Owns inverse-CDF sampling: over the candidates when the kept set fits in them, and over the
full vocabulary in two levels (block sums, then one block) otherwise. Either way a row uses
one uniform from its own key, so a seeded row draws the same token whatever the batch.
The full-vocabulary pass also returns the kept mass and entropy numerator, so the
processed logprob and entropy of such rows cost no extra pass.

Must not decide the kept set.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, UInt32

from sgl_jax_rollout.sampling.batch import KEY_IMPL
from sgl_jax_rollout.sampling.distribution import mass_and_moment

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
) -> tuple[Int[Array, " batch"], Float[Array, " batch"], Float[Array, " batch"] | None]:
    """Samples from exp(t - top), t = logits * inv_temperature, restricted to t >= threshold.

    Returns the token, the kept mass S and (when `with_moment`) sum w (t - top) over the kept
    set, for the processed entropy `log S - moment / S`. Tempered values are recomputed
    inside each fused pass rather than stored.
    """
    rows, vocab = logits.shape
    block = _block_size(vocab)
    padded = -(-vocab // block) * block
    if padded != vocab:
        logits = jnp.pad(logits, ((0, 0), (0, padded - vocab)), constant_values=-jnp.inf)

    def kept(values: Float[Array, "batch n"]) -> Float[Array, "batch n"]:
        t = values * inv_temperature[:, None]
        return jnp.where(t >= threshold[:, None], t, -jnp.inf)

    if with_moment:
        mass, moment = mass_and_moment(kept(logits), top)
    else:
        mass, moment = jnp.exp(kept(logits) - top[:, None]).sum(-1), None
    block_mass = jnp.exp(kept(logits) - top[:, None]).reshape(rows, -1, block).sum(-1)
    target = uniform * mass
    block_index = inverse_cdf(block_mass, target)
    below = jnp.take_along_axis(jnp.cumsum(block_mass, -1) - block_mass, block_index[:, None], 1)
    inside = jax.vmap(lambda row, b: jax.lax.dynamic_slice(row, (b * block,), (block,)))(
        logits, block_index
    )
    offset = inverse_cdf(jnp.exp(kept(inside) - top[:, None]), target - below[:, 0])
    return block_index * block + offset, mass, moment


def _block_size(vocab: int) -> int:
    """A divisor of the vocabulary near its square root (no padding), else the square root."""
    root = math.isqrt(vocab - 1) + 1
    for size in range(root, min(vocab, _MAX_BLOCK) + 1):
        if vocab % size == 0:
            return size
    return root
