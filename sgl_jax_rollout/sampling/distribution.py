"""Normalisers and entropies of (possibly truncated) distributions given by logits.

Owns the float32 arithmetic shared by every sampler output: safe row maxima, the two fused
passes over the vocabulary that give a normaliser and an entropy numerator, and the entropy of
a set of unnormalised weights with `0 * log 0 = 0`.

Must not decide which tokens are kept nor sample.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float


def finite_or_zero(x: Float[Array, " batch"]) -> Float[Array, " batch"]:
    """Row maxima that are safe to subtract (a fully masked row has max -inf)."""
    return jnp.where(jnp.isfinite(x), x, 0.0)


def mass_and_moment(
    scaled: Float[Array, "batch vocab"], offset: Float[Array, " batch"]
) -> tuple[Float[Array, " batch"], Float[Array, " batch"]]:
    """`S = sum exp(x - offset)` and `E = sum exp(x - offset) * (x - offset)`.

    Entropy is `log S - E / S`; masked (-inf) entries contribute 0 to both.
    """
    mass = jnp.exp(scaled - offset[:, None]).sum(-1)
    return mass, moment_given_mass(scaled, offset, mass)


def moment_given_mass(
    scaled: Float[Array, "batch vocab"],
    offset: Float[Array, " batch"],
    mass: Float[Array, " batch"],
) -> Float[Array, " batch"]:
    """`E` of `mass_and_moment` from its `S`, by a reduction that shares no intermediate
    array with the one that gave `S`: `E = e * sum w' d' + S` with `d' = x - offset - 1`,
    `w' = exp(d')`. With a shared `exp(x - offset)`, XLA's CPU backend writes it (and any
    broadcast constant) out as a `[batch, vocab]` array and reduces it twice, about 3x the time
    of two fused passes; a variadic reduce of both sums is slower still. `d'` is clamped at
    -200 (where `w'` is exactly 0) so that masked entries give `0 * -200`, not `0 * -inf`.
    """
    shifted = jnp.maximum(scaled - (offset + 1.0)[:, None], -200.0)
    return math.e * (jnp.exp(shifted) * shifted).sum(-1) + mass


def entropy_from_mass(
    mass: Float[Array, " batch"], moment: Float[Array, " batch"]
) -> Float[Array, " batch"]:
    """`-(sum p log p)` from `mass_and_moment`; 0 for an empty row."""
    safe = jnp.where(mass > 0, mass, 1.0)
    return jnp.where(mass > 0, jnp.log(safe) - moment / safe, 0.0)


def entropy_of_weights(
    weights: Float[Array, "batch n"], log_weights: Float[Array, "batch n"]
) -> Float[Array, " batch"]:
    """Entropy of `weights` renormalised over the row; `log_weights` = log(weights) where > 0."""
    mass = weights.sum(-1)
    moment = jnp.where(weights > 0, weights * log_weights, 0.0).sum(-1)
    return entropy_from_mass(mass, moment)


def entropy_of_logits(logits: Float[Array, "... vocab"]) -> Float[Array, ...]:
    """Entropy of `softmax(logits)` along the last axis, in float32 (one pass per row)."""
    flat = logits.reshape(-1, logits.shape[-1]).astype(jnp.float32)
    mass, moment = mass_and_moment(flat, finite_or_zero(jnp.max(flat, axis=-1)))
    return entropy_from_mass(mass, moment).reshape(logits.shape[:-1])


def log_or_neg_inf(x: Float[Array, ...]) -> Float[Array, ...]:
    """`log x` with log 0 = -inf and no warning-producing NaN paths."""
    return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), -jnp.inf)
