"""Top-k, top-p and min-p as one threshold per row (step 4 of the sampler's order).

Owns how the kept set is found without sorting the vocabulary. Every rule keeps the tokens
whose tempered logit is >= a row threshold (ties at the boundary are all kept, as Hugging
Face's top-k does):
- top-k: the k-th largest value;
- top-p (applied to the top-k set renormalised): the value of the last token of the
  smallest descending prefix whose mass reaches p;
- min-p: `max + log(min_p)`, i.e. p_i >= min_p * p_max.

Fast path: `lax.top_k` takes C = candidates + 1 values; when the row's threshold is strictly
above the last (sentinel) value, the whole kept set is inside the candidates and exact.
Otherwise `search_thresholds` finds the same thresholds exactly over the full vocabulary by
bisection on the float32 bit order (32 passes per rule, only for rows that need it).

Must not sample or compute outputs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from sgl_jax_rollout.sampling.batch import SamplingBatch
from sgl_jax_rollout.sampling.distribution import finite_or_zero

NEG_INF = -jnp.inf


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Candidates:
    """The C largest penalised logits of each row, descending; `values` are tempered."""

    values: Float[Array, "batch c"]
    raw_values: Float[Array, "batch c"]
    ids: Int[Array, "batch c"]
    # Row maximum of the tempered logits, finite (0 for a fully masked row).
    top: Float[Array, " batch"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Truncation:
    """Per-row kept set: tokens with tempered logit >= `threshold`."""

    threshold: Float[Array, " batch"]
    # Kept set known to lie inside the candidates (excluding the sentinel).
    bounded: Bool[Array, " batch"]
    # Rows that need `search_thresholds` before sampling.
    needs_search: Bool[Array, " batch"]
    # Parts `search_thresholds` reuses.
    known_top_k_threshold: Float[Array, " batch"]
    min_p_threshold: Float[Array, " batch"]


def top_k(x: Float[Array, "batch vocab"], k: int) -> tuple[Array, Array]:
    """`lax.top_k` behind barriers: they keep XLA from folding later gathers into the sort
    that top-k lowers to; folded, the sort is not rewritten into the TopK kernel and the whole
    vocabulary gets sorted (seen on CPU: 30 ms per row instead of 0.2). One barrier per
    output: a single barrier over the (values, ids) pair crashes XLA's CPU TopK decomposer
    when the engine shards over a tensor axis (jax 0.10.2, tp = 2)."""
    values, ids = lax.top_k(x, k)
    return lax.optimization_barrier(values), lax.optimization_barrier(ids)


def take_candidates(
    logits: Float[Array, "batch vocab"], inv_temperature: Float[Array, " batch"], count: int
) -> Candidates:
    """Top `count` of the untempered logits (temperature > 0 keeps the order), then tempered."""
    raw_values, ids = top_k(logits, count)
    values = raw_values * inv_temperature[:, None]
    return Candidates(values, raw_values, ids, finite_or_zero(values[:, 0]))


def truncate_with_candidates(
    cand: Candidates,
    batch: SamplingBatch,
    vocab_size: int,
    full_mass: Float[Array, " batch"],
) -> Truncation:
    """Thresholds from the candidates alone; `full_mass` = sum exp(t - top) over the vocab
    (only read for rows with top-p on and top-k off)."""
    count = cand.values.shape[1]
    k = batch.top_k
    k_on = (k > 0) & (k < vocab_size)
    # k <= count - 1: the k-th value is a candidate and the sentinel proves there is no tie.
    k_known = k_on & (k < count)
    thr_k = jnp.where(k_known, _take(cand.values, k - 1), NEG_INF)

    weights = jnp.exp(cand.values - cand.top[:, None])
    in_top_k = jnp.where(cand.values >= thr_k[:, None], weights, 0.0)
    mass_top_k = jnp.where(k_on, in_top_k.sum(-1), full_mass)
    before = jnp.cumsum(in_top_k, axis=-1) - in_top_k
    n_top_p = jnp.sum(before < (batch.top_p * mass_top_k)[:, None], axis=-1)
    p_on = batch.top_p < 1.0
    thr_p = jnp.where(p_on, _take(cand.values, n_top_p - 1), NEG_INF)

    min_p_on = batch.min_p > 0
    thr_min_p = jnp.where(
        min_p_on, cand.top + jnp.log(jnp.where(min_p_on, batch.min_p, 1.0)), NEG_INF
    )
    threshold = jnp.maximum(jnp.maximum(thr_k, thr_p), thr_min_p)

    truncated = k_on | p_on | min_p_on
    # top-k beyond the candidates leaves the top-p mass unknown.
    known = ~(k_on & ~k_known & p_on)
    # With every token a candidate there is no sentinel: the kept set always fits.
    fits = jnp.ones_like(truncated) if count == vocab_size else threshold > cand.values[:, -1]
    bounded = truncated & known & fits
    greedy = batch.temperature == 0
    return Truncation(
        threshold=jnp.where(truncated, threshold, NEG_INF),
        bounded=bounded,
        needs_search=truncated & ~bounded & ~greedy,
        known_top_k_threshold=thr_k,
        min_p_threshold=thr_min_p,
    )


def search_thresholds(
    logits: Float[Array, "batch vocab"],
    inv_temperature: Float[Array, " batch"],
    top: Float[Array, " batch"],
    batch: SamplingBatch,
    trunc: Truncation,
) -> Float[Array, " batch"]:
    """Exact thresholds over the full vocabulary (for rows the candidates could not settle)."""
    vocab = logits.shape[-1]
    tempered = logits * inv_temperature[:, None]
    k = batch.top_k
    k_on = (k > 0) & (k < vocab)
    k_unknown = k_on & jnp.isneginf(trunc.known_top_k_threshold)

    def count_at_least(thr: Float[Array, " batch"]) -> Int[Array, " batch"]:
        return jnp.sum(tempered >= thr[:, None], axis=-1)

    thr_k = lax.cond(
        jnp.any(k_unknown),
        lambda: jnp.where(
            k_unknown,
            _largest_threshold(lambda t: count_at_least(t) >= k, k.shape),
            trunc.known_top_k_threshold,
        ),
        lambda: trunc.known_top_k_threshold,
    )

    def mass_at_least(thr: Float[Array, " batch"]) -> Float[Array, " batch"]:
        w = jnp.exp(tempered - top[:, None])
        return jnp.sum(jnp.where(tempered >= thr[:, None], w, 0.0), axis=-1)

    target = batch.top_p * mass_at_least(thr_k)
    thr_p = _largest_threshold(
        lambda t: mass_at_least(jnp.maximum(t, thr_k)) >= target, batch.top_p.shape
    )
    thr_p = jnp.where(batch.top_p < 1.0, thr_p, NEG_INF)
    return jnp.maximum(jnp.maximum(thr_k, thr_p), trunc.min_p_threshold)


def _take(values: Float[Array, "batch c"], index: Int[Array, " batch"]) -> Float[Array, " batch"]:
    index = jnp.clip(index, 0, values.shape[1] - 1)
    return jnp.take_along_axis(values, index[:, None], axis=1)[:, 0]


_NEG_INF_KEY = 0x007FFFFF  # order key of -inf; smaller keys are negative NaNs


def _key_to_float(key: Array) -> Array:
    """Inverse of the monotone map float32 -> uint32 (negatives flipped, sign bit set)."""
    bits = jnp.where(key >= jnp.uint32(0x80000000), key ^ jnp.uint32(0x80000000), ~key)
    value = lax.bitcast_convert_type(bits, jnp.float32)
    return jnp.where(key <= jnp.uint32(_NEG_INF_KEY), NEG_INF, value)


def _largest_threshold(predicate, shape: tuple[int, ...]) -> Float[Array, ...]:
    """Largest float32 x (in bit order) with predicate(x) true, for a predicate that is true
    below some point and false above it. Builds the order key bit by bit: 32 evaluations."""

    def step(i, key):
        trial = key | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        return jnp.where(predicate(_key_to_float(trial)), trial, key)

    key = lax.fori_loop(0, 32, step, jnp.zeros(shape, jnp.uint32))
    return _key_to_float(key)
