"""Top-k, top-p and min-p as one threshold per row (step 4 of the sampler's order).

Owns how the kept set is found without sorting the vocabulary. Every rule keeps the tokens
whose tempered logit is >= a row threshold (ties at the boundary are all kept, as Hugging
Face's top-k does):
- top-k: the k-th largest value;
- top-p (applied to the top-k set renormalised): the value of the last token of the
  smallest descending prefix whose mass reaches p;
- min-p: `max + log(min_p)`, i.e. p_i >= min_p * p_max.

Fast path: `Vocab.top_k` takes C = candidates + 1 values; when the row's threshold is strictly
above the last (sentinel) value, the whole kept set is inside the candidates and exact. A
threshold known exactly but at or below the sentinel (min-p, a k-th value tied with the
sentinel) keeps a set larger than the candidates: the draw goes over the vocabulary with it.
Only a threshold the candidates cannot settle (top-k beyond them, a top-p prefix that reaches
the sentinel or rests on a top-k set with ties outside them) is found by `search_thresholds`,
exactly, by bisection on the float32 bit order (32 passes per rule, for the rules and rows
that need it).

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
from sgl_jax_rollout.sampling.vocab import Vocab

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


def take_candidates(
    logits: Float[Array, "batch vocab"],
    inv_temperature: Float[Array, " batch"],
    count: int,
    vocab: Vocab,
) -> Candidates:
    """Top `count` of the untempered logits (temperature > 0 keeps the order), then tempered."""
    raw_values, ids = vocab.top_k(logits, count)
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
    # With every token a candidate there is no sentinel: the kept set always fits.
    sentinel = NEG_INF if count == vocab_size else cand.values[:, -1]
    # The top-k set's mass is known when that set lies inside the candidates (its k-th value
    # above the sentinel: no tie outside), or from the full-vocabulary pass when top-k is off.
    top_k_mass_known = jnp.where(k_on, k_known & (thr_k > sentinel), True)
    # top-p's threshold is exact when its prefix ends before the sentinel, on a known mass.
    p_exact = ~p_on | (top_k_mass_known & (thr_p > sentinel))
    # top-k's is exact whenever the k-th value is a candidate; min-p's always is.
    exact = (~k_on | k_known) & p_exact
    greedy = batch.temperature == 0
    return Truncation(
        threshold=jnp.where(truncated, threshold, NEG_INF),
        bounded=truncated & exact & (threshold > sentinel),
        needs_search=truncated & ~exact & ~greedy,
        known_top_k_threshold=thr_k,
        min_p_threshold=thr_min_p,
    )


def search_thresholds(
    logits: Float[Array, "batch vocab"],
    inv_temperature: Float[Array, " batch"],
    top: Float[Array, " batch"],
    batch: SamplingBatch,
    trunc: Truncation,
    vocab: Vocab,
) -> Float[Array, " batch"]:
    """Exact thresholds over the full vocabulary (for rows the candidates could not settle):
    each bisection step counts, or sums the mass, above a trial threshold (a local pass and
    one `[batch]` reduction over the shards)."""
    tempered = logits * inv_temperature[:, None]
    k = batch.top_k
    k_on = (k > 0) & (k < vocab.size)
    k_unknown = k_on & jnp.isneginf(trunc.known_top_k_threshold)

    def count_at_least(thr: Float[Array, " batch"]) -> Int[Array, " batch"]:
        return vocab.sum(jnp.sum(tempered >= thr[:, None], axis=-1))

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
        return vocab.sum(jnp.sum(jnp.where(tempered >= thr[:, None], w, 0.0), axis=-1))

    def top_p_threshold() -> Float[Array, " batch"]:
        target = batch.top_p * mass_at_least(thr_k)
        thr_p = _largest_threshold(
            lambda t: mass_at_least(jnp.maximum(t, thr_k)) >= target, batch.top_p.shape
        )
        return jnp.where(p_on, thr_p, NEG_INF)

    p_on = batch.top_p < 1.0
    thr_p = lax.cond(
        jnp.any(p_on), top_p_threshold, lambda: jnp.full(p_on.shape, NEG_INF, jnp.float32)
    )
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
