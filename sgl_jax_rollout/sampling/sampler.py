"""The jitted sampling step: penalties, temperature, truncation, draw, logprob and entropy.

This docstring is the one place where the order of docs/design.md section 3 is written. For each
row of the batch, with that row's own settings:

1. `z` = model logits upcast to float32; ids at or beyond `valid_vocab_size` are -inf.
2. Penalties on `z` (`penalties.apply_penalties`): repetition over prompt and output ids
   (`z / p` where `z > 0`, `z * p` otherwise), presence (`- pr` once per output id) and
   frequency (`- f * count`), then min_new_tokens (stop ids -inf until enough tokens).
3. Temperature: `t = z / T`; `T == 0` marks a greedy row (its processed distribution is the
   penalised, untempered one, and its token is the argmax).
4. Truncation on `t` (`truncation`): top-k, then top-p on the renormalised top-k set, then
   min-p, each expressed as a threshold; the kept set is `t >= threshold`.
5. Draw (`draw`): one uniform from the row's key, inverse CDF over the kept set
   (renormalised), from the candidates when the kept set fits in them, else over the vocab.

Outputs for the sampled token, in the same pass:
- logprob: "processed" = log of its probability at step 5 (the behaviour policy), "raw" =
  `log_softmax(z)` of step 1;
- entropy of the "raw" (step 1) or "processed" (step 5) distribution: over the full
  vocabulary (`entropy_top_k == 0`) or over its k largest logits renormalised (bounded by
  log k); `-(sum p log p)` in float32 with `0 log 0 = 0`;
- optionally the top-n tokens with logprobs of the same mode.

Work per step: one `lax.top_k` of C values; one pass over the vocabulary for each full-vocab
quantity asked for (raw normaliser and entropy; processed normaliser only for rows with
top-p and no top-k, or rows whose kept set is the vocabulary). Rows that need an exact search
or a full-vocab draw trigger them through `lax.cond` on runtime values, which never
recompiles. Per-row settings are arrays: one compile per (batch size, vocab, SamplerConfig).

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from sgl_jax_rollout.sampling.batch import SamplerConfig, SamplerOutput, SamplingBatch
from sgl_jax_rollout.sampling.distribution import (
    entropy_from_mass,
    entropy_of_weights,
    finite_or_zero,
    log_or_neg_inf,
    mass_and_moment,
)
from sgl_jax_rollout.sampling.draw import draw_from_vocab, inverse_cdf, row_uniforms
from sgl_jax_rollout.sampling.penalties import apply_penalties
from sgl_jax_rollout.sampling.truncation import (
    search_thresholds,
    take_candidates,
    top_k,
    truncate_with_candidates,
)

DEFAULT_CONFIG = SamplerConfig()


@functools.partial(jax.jit, static_argnames=("config",))
def sample(
    logits: Float[Array, "batch vocab"],
    batch: SamplingBatch,
    config: SamplerConfig = DEFAULT_CONFIG,
) -> SamplerOutput:
    """One decode step for every row of `batch` (see the module docstring for the order)."""
    rows, vocab = logits.shape
    config.check_vocab(vocab)
    zeros = jnp.zeros((rows,), jnp.float32)

    # 1. Raw logits.
    raw = logits.astype(jnp.float32)
    if config.valid_vocab_size is not None and config.valid_vocab_size < vocab:
        raw = raw.at[:, config.valid_vocab_size :].set(-jnp.inf)
    # 2. Penalties.
    z = apply_penalties(raw, batch) if config.penalties else raw
    # 3. Temperature (applied to candidate values and inside each fused pass, never stored).
    greedy = batch.temperature == 0
    inv_t = 1.0 / jnp.where(greedy, 1.0, batch.temperature)
    # 4. Truncation.
    cand = take_candidates(z, inv_t, config.candidate_count(vocab))
    top = cand.top
    top_p_over_vocab = ~greedy & ((batch.top_k <= 0) | (batch.top_k >= vocab)) & (batch.top_p < 1)
    full_mass = lax.cond(
        jnp.any(top_p_over_vocab),
        lambda: jnp.exp(z * inv_t[:, None] - top[:, None]).sum(-1),
        lambda: zeros,
    )
    trunc = truncate_with_candidates(cand, batch, vocab, full_mass)
    threshold = lax.cond(
        jnp.any(trunc.needs_search),
        lambda: jnp.where(
            trunc.needs_search,
            search_thresholds(z, inv_t, top, batch, trunc),
            trunc.threshold,
        ),
        lambda: trunc.threshold,
    )

    # 5. Draw.
    uniform = row_uniforms(batch.keys)
    from_candidates = trunc.bounded & ~greedy
    cand_weights = jnp.where(
        cand.values >= threshold[:, None], jnp.exp(cand.values - top[:, None]), 0.0
    )
    cand_mass = cand_weights.sum(-1)
    cand_pos = inverse_cdf(cand_weights, uniform * cand_mass)

    processed_full_entropy = (
        config.return_entropy and config.entropy_source == "processed" and not config.entropy_top_k
    )
    greedy_needs_mass = processed_full_entropy or (
        config.logprobs_mode == "processed" and (config.return_logprob or config.top_logprobs)
    )
    over_vocab = ~from_candidates & (~greedy | greedy_needs_mass)
    vocab_threshold = jnp.where(greedy, -jnp.inf, threshold)
    vocab_token, vocab_mass, vocab_moment = lax.cond(
        jnp.any(over_vocab),
        lambda: draw_from_vocab(z, inv_t, top, vocab_threshold, uniform, processed_full_entropy),
        lambda: (jnp.zeros((rows,), jnp.int32), zeros, zeros if processed_full_entropy else None),
    )
    tokens = jnp.where(
        greedy,
        cand.ids[:, 0],
        jnp.where(from_candidates, _take(cand.ids, cand_pos), vocab_token),
    ).astype(jnp.int32)

    # Outputs.
    kept_mass = jnp.where(from_candidates, cand_mass, vocab_mass)
    log_kept_mass = log_or_neg_inf(kept_mass)
    raw_top = _raw_top(raw, cand, config)
    raw_stats = _raw_stats(raw, config)

    logprobs = None
    if config.return_logprob:
        if config.logprobs_mode == "processed":
            token_t = jnp.where(
                from_candidates, _take(cand.values, cand_pos), _take(z, tokens) * inv_t
            )
            logprobs = token_t - top - log_kept_mass
        else:
            logprobs = _take(raw, tokens) - raw_stats[0]

    entropy = None
    if config.return_entropy:
        k = config.entropy_top_k
        if config.entropy_source == "processed" and k:
            values = cand.values[:, :k]
            kept = values >= vocab_threshold[:, None]
            weights = jnp.where(kept, jnp.exp(values - top[:, None]), 0.0)
            entropy = entropy_of_weights(weights, values - top[:, None])
        elif config.entropy_source == "processed":
            entropy = jnp.where(
                from_candidates,
                entropy_of_weights(cand_weights, cand.values - top[:, None]),
                entropy_from_mass(vocab_mass, vocab_moment),
            )
        elif k:
            values = raw_top[0][:, :k]
            shifted = values - finite_or_zero(values[:, 0])[:, None]
            entropy = entropy_of_weights(jnp.exp(shifted), shifted)
        else:
            entropy = entropy_from_mass(raw_stats[1], raw_stats[2])

    top_ids = top_values = None
    if config.top_logprobs:
        n = config.top_logprobs
        if config.logprobs_mode == "processed":
            values = cand.values[:, :n]
            kept = values >= vocab_threshold[:, None]
            top_ids = cand.ids[:, :n]
            top_values = jnp.where(kept, values - top[:, None] - log_kept_mass[:, None], -jnp.inf)
        else:
            top_ids = raw_top[1][:, :n]
            top_values = raw_top[0][:, :n] - raw_stats[0][:, None]

    return SamplerOutput(tokens, logprobs, entropy, top_ids, top_values)


def _raw_stats(raw: Float[Array, "batch vocab"], config: SamplerConfig):
    """(log-normaliser, mass, moment) of the raw distribution, when an output needs them."""
    wants_logprob = (config.return_logprob or config.top_logprobs) and (
        config.logprobs_mode == "raw"
    )
    wants_entropy = (
        config.return_entropy and config.entropy_source == "raw" and not config.entropy_top_k
    )
    if not (wants_logprob or wants_entropy):
        return None, None, None
    top = finite_or_zero(jnp.max(raw, axis=-1))
    mass, moment = mass_and_moment(raw, top)
    return top + log_or_neg_inf(mass), mass, moment


def _raw_top(raw: Float[Array, "batch vocab"], cand, config: SamplerConfig):
    """(values, ids) of the largest raw logits, as many as raw top-k entropy or raw top
    logprobs need: the candidates' own when no penalty can reorder them."""
    entropy_k = config.entropy_top_k if config.return_entropy else 0
    n = max(
        entropy_k if config.entropy_source == "raw" else 0,
        config.top_logprobs if config.logprobs_mode == "raw" else 0,
    )
    if not n:
        return None, None
    if not config.penalties:
        return cand.raw_values[:, :n], cand.ids[:, :n]
    return top_k(raw, n)


def _take(values: Array, index: Array) -> Array:
    return jnp.take_along_axis(values, index[:, None].astype(jnp.int32), axis=1)[:, 0]
