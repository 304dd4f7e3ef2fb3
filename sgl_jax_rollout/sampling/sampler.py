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
5. Draw (`draw`): one uniform from the row's key folded with its generated count (so a
   seeded row draws the same tokens in any batch), inverse CDF over the kept set
   (renormalised), from the candidates when the kept set fits in them, else over the vocab.

Outputs for the sampled token, in the same pass:
- logprob: "processed" = log of its probability at step 5 (the behaviour policy), "raw" =
  `log_softmax(z)` of step 1;
- entropy of the "raw" (step 1) or "processed" (step 5) distribution: over the full
  vocabulary (`entropy_top_k == 0`) or over its k largest logits renormalised (bounded by
  log k); `-(sum p log p)` in float32 with `0 log 0 = 0`;
- optionally the top-n tokens with logprobs of the same mode.

Work per step: one exact top-k of C values (`vocab.blocked_top_k`); a pass over the vocabulary
for each full-vocab quantity asked for (raw normaliser and entropy; processed normaliser only
for rows with top-p and no top-k, or rows whose kept set is larger than the candidates). Rows
that need an exact search or a full-vocab draw trigger them through `lax.cond` on runtime
values, which never recompiles. Per-row settings are arrays: one compile per (batch size,
vocab, SamplerConfig).

Every stage reads the vocabulary through a `vocab.Vocab`: `sample` holds all of it;
`vocab_parallel.sample_vocab_parallel` runs `sample_step` on each device's shard of it under
`shard_map`, with collectives only on per-row values and candidates.

`sample` calls one function per step above, in that order; `outputs.gather` computes the
outputs from what the steps produced.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float

from sgl_jax_rollout.sampling.batch import SamplerConfig, SamplerOutput, SamplingBatch, step_keys
from sgl_jax_rollout.sampling.draw import Drawn, draw_from_vocab, inverse_cdf, row_uniforms, take
from sgl_jax_rollout.sampling.outputs import gather
from sgl_jax_rollout.sampling.penalties import apply_penalties
from sgl_jax_rollout.sampling.truncation import (
    Candidates,
    search_thresholds,
    take_candidates,
    truncate_with_candidates,
)
from sgl_jax_rollout.sampling.vocab import Vocab

DEFAULT_CONFIG = SamplerConfig()


@functools.partial(jax.jit, static_argnames=("config",))
def sample(
    logits: Float[Array, "batch vocab"],
    batch: SamplingBatch,
    config: SamplerConfig = DEFAULT_CONFIG,
) -> SamplerOutput:
    """One decode step for every row of `batch`, the vocabulary on this device (see the
    module docstring for the order)."""
    return sample_step(logits, batch, config, Vocab(logits.shape[1]))


def sample_step(
    logits: Float[Array, "batch local"],
    batch: SamplingBatch,
    config: SamplerConfig,
    vocab: Vocab,
) -> SamplerOutput:
    """`sample` on this device's columns of `vocab` (all of them when it is whole;
    `vocab_parallel` runs it inside `shard_map`, one shard per device)."""
    config.check_vocab(vocab.size)
    raw = raw_logits(logits, config, vocab)  # 1
    z = apply_penalties(raw, batch, vocab) if config.penalties else raw  # 2
    greedy, inv_t = temperature(batch)  # 3
    cand, threshold, bounded = truncate(z, inv_t, greedy, batch, config, vocab)  # 4
    drawn = draw(z, inv_t, greedy, cand, threshold, bounded, batch, config, vocab)  # 5
    return gather(raw, z, inv_t, cand, drawn, config, vocab)


def raw_logits(
    logits: Float[Array, "batch local"], config: SamplerConfig, vocab: Vocab
) -> Float[Array, "batch local"]:
    """Step 1: float32 logits, ids at or beyond `valid_vocab_size` at -inf."""
    raw = logits.astype(jnp.float32)
    valid = config.valid_vocab_size
    if valid is not None and valid < vocab.size:
        raw = jnp.where(vocab.ids(raw.shape[1]) < valid, raw, -jnp.inf)
    return raw


def temperature(batch: SamplingBatch) -> tuple[Bool[Array, " batch"], Float[Array, " batch"]]:
    """Step 3: (greedy rows, 1 / T with 1 for greedy rows). Applied to candidate values and
    inside each fused pass, never stored."""
    greedy = batch.temperature == 0
    return greedy, 1.0 / jnp.where(greedy, 1.0, batch.temperature)


def truncate(
    z: Float[Array, "batch vocab"],
    inv_t: Float[Array, " batch"],
    greedy: Bool[Array, " batch"],
    batch: SamplingBatch,
    config: SamplerConfig,
    vocab: Vocab,
) -> tuple[Candidates, Float[Array, " batch"], Bool[Array, " batch"]]:
    """Step 4: (candidates, per-row threshold on tempered logits, kept set inside the
    candidates). The exact search runs only when a row needs it."""
    rows = z.shape[0]
    cand = take_candidates(z, inv_t, config.candidate_count(vocab.size), vocab)
    top = cand.top
    top_k_off = (batch.top_k <= 0) | (batch.top_k >= vocab.size)
    top_p_over_vocab = ~greedy & top_k_off & (batch.top_p < 1)
    full_mass = lax.cond(
        jnp.any(top_p_over_vocab),
        lambda: vocab.sum(jnp.exp(z * inv_t[:, None] - top[:, None]).sum(-1)),
        lambda: jnp.zeros((rows,), jnp.float32),
    )
    trunc = truncate_with_candidates(cand, batch, vocab.size, full_mass)
    threshold = lax.cond(
        jnp.any(trunc.needs_search),
        lambda: jnp.where(
            trunc.needs_search,
            search_thresholds(z, inv_t, top, batch, trunc, vocab),
            trunc.threshold,
        ),
        lambda: trunc.threshold,
    )
    return cand, threshold, trunc.bounded


def draw(
    z: Float[Array, "batch vocab"],
    inv_t: Float[Array, " batch"],
    greedy: Bool[Array, " batch"],
    cand: Candidates,
    threshold: Float[Array, " batch"],
    bounded: Bool[Array, " batch"],
    batch: SamplingBatch,
    config: SamplerConfig,
    vocab: Vocab,
) -> Drawn:
    """Step 5: one uniform per row, inverse CDF over the kept set, from the candidates when
    the kept set fits in them, else over the vocabulary; greedy rows take the argmax (a
    vocabulary pass still runs for them when a processed output needs the kept mass)."""
    rows = z.shape[0]
    zeros = jnp.zeros((rows,), jnp.float32)
    top = cand.top
    uniform = row_uniforms(step_keys(batch.keys, batch.num_generated))
    from_candidates = bounded & ~greedy
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
        lambda: draw_from_vocab(
            z, inv_t, top, vocab_threshold, uniform, processed_full_entropy, vocab
        ),
        lambda: (jnp.zeros((rows,), jnp.int32), zeros, zeros if processed_full_entropy else None),
    )
    tokens = jnp.where(
        greedy,
        cand.ids[:, 0],
        jnp.where(from_candidates, take(cand.ids, cand_pos), vocab_token),
    ).astype(jnp.int32)
    return Drawn(
        tokens,
        from_candidates,
        cand_pos,
        cand_weights,
        cand_mass,
        vocab_threshold,
        vocab_mass,
        vocab_moment,
    )
