"""The sampler's outputs for the sampled token, from what its steps produced.

Owns `gather`: the logprob ("processed": log of the token's probability in the kept,
renormalised, tempered distribution the draw used; "raw": `log_softmax` of the step-1 logits),
the entropy (raw or processed distribution, over the full vocabulary or its top k
renormalised) and the top-n logprobs of the same mode, each computed only when the static
`SamplerConfig` asks for it. Full-vocabulary raw quantities take the passes of
`mass_and_moment` (`_raw_stats`), after a maximum pass only when penalties moved the
candidates off the raw logits; everything else reuses the candidates and the draw's masses.
The semantics are docs/design.md section 3 and the order in `sampler.py`'s docstring.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from sgl_jax_rollout.sampling.batch import SamplerConfig, SamplerOutput
from sgl_jax_rollout.sampling.distribution import (
    entropy_from_mass,
    entropy_of_weights,
    finite_or_zero,
    log_or_neg_inf,
    mass_and_moment,
)
from sgl_jax_rollout.sampling.draw import Drawn, take
from sgl_jax_rollout.sampling.truncation import Candidates
from sgl_jax_rollout.sampling.vocab import Vocab


def gather(
    raw: Float[Array, "batch vocab"],
    z: Float[Array, "batch vocab"],
    inv_t: Float[Array, " batch"],
    cand: Candidates,
    drawn: Drawn,
    config: SamplerConfig,
    vocab: Vocab,
) -> SamplerOutput:
    """The `SamplerOutput` of one step: tokens, and the logprob, entropy and top logprobs the
    config asks for (None otherwise). Every output is the same on every shard of `vocab`."""
    top = cand.top
    log_kept_mass = log_or_neg_inf(
        jnp.where(drawn.from_candidates, drawn.cand_mass, drawn.vocab_mass)
    )
    raw_top = _raw_top(raw, cand, config, vocab)
    raw_stats = _raw_stats(raw, cand, config, vocab)
    tokens = drawn.tokens

    logprobs = None
    if config.return_logprob:
        if config.logprobs_mode == "processed":
            token_t = jnp.where(
                drawn.from_candidates,
                take(cand.values, drawn.cand_pos),
                vocab.take(z, tokens) * inv_t,
            )
            logprobs = token_t - top - log_kept_mass
        else:
            logprobs = vocab.take(raw, tokens) - raw_stats[0]

    entropy = None
    if config.return_entropy:
        k = config.entropy_top_k
        if config.entropy_source == "processed" and k:
            values = cand.values[:, :k]
            kept = values >= drawn.vocab_threshold[:, None]
            weights = jnp.where(kept, jnp.exp(values - top[:, None]), 0.0)
            entropy = entropy_of_weights(weights, values - top[:, None])
        elif config.entropy_source == "processed":
            entropy = jnp.where(
                drawn.from_candidates,
                entropy_of_weights(drawn.cand_weights, cand.values - top[:, None]),
                entropy_from_mass(drawn.vocab_mass, drawn.vocab_moment),
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
            kept = values >= drawn.vocab_threshold[:, None]
            top_ids = cand.ids[:, :n]
            top_values = jnp.where(kept, values - top[:, None] - log_kept_mass[:, None], -jnp.inf)
        else:
            top_ids = raw_top[1][:, :n]
            top_values = raw_top[0][:, :n] - raw_stats[0][:, None]

    return SamplerOutput(tokens, logprobs, entropy, top_ids, top_values)


def _raw_stats(
    raw: Float[Array, "batch vocab"], cand: Candidates, config: SamplerConfig, vocab: Vocab
):
    """(log-normaliser, mass, moment) of the raw distribution, when an output needs them.
    Without penalties the candidates were taken from the raw logits: their first value is
    the row maximum, so only the mass and moment pass runs."""
    wants_logprob = (config.return_logprob or config.top_logprobs) and (
        config.logprobs_mode == "raw"
    )
    wants_entropy = (
        config.return_entropy and config.entropy_source == "raw" and not config.entropy_top_k
    )
    if not (wants_logprob or wants_entropy):
        return None, None, None
    row_max = vocab.max(jnp.max(raw, axis=-1)) if config.penalties else cand.raw_values[:, 0]
    top = finite_or_zero(row_max)
    mass, moment = vocab.sum(mass_and_moment(raw, top))
    return top + log_or_neg_inf(mass), mass, moment


def _raw_top(
    raw: Float[Array, "batch vocab"], cand: Candidates, config: SamplerConfig, vocab: Vocab
):
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
    return vocab.top_k(raw, n)
