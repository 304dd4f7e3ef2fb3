"""Penalties on the logits (step 2 of the sampler's order).

Owns the repetition (HF / vLLM), frequency and presence (OpenAI) penalties and min_new_tokens,
from either of two equal inputs:
- token-id arrays (`prompt_ids`, `output_ids`): the work is O(batch x history) scatters into
  one copy of the logits, never a dense [batch, vocab] count (the standalone sampler);
- dense occurrence tables (`seen`, `output_counts`, from `occurrence_tables`): elementwise over
  [batch, vocab], whatever the history's length (the engine, which keeps them per request on
  the device and advances them from each sampled token).

Must not sample, temper or truncate.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from sgl_jax_rollout.sampling.batch import SamplingBatch
from sgl_jax_rollout.sampling.vocab import Vocab


def apply_penalties(
    logits: Float[Array, "batch vocab"], batch: SamplingBatch, vocab: Vocab | None = None
) -> Float[Array, "batch vocab"]:
    """Penalised logits: repetition, then presence and frequency, then min_new_tokens.

    Scatter-set writes the same value for every duplicate of an id, so duplicates are
    harmless; the frequency penalty is a scatter-add, one `-f` per occurrence. A batch that
    carries `output_counts` is penalised from its dense tables instead. Under a sharded
    `vocab`, `logits` (and the tables) are this shard's columns; ids elsewhere are dropped.
    """
    local = logits.shape[-1]
    offset = 0 if vocab is None else vocab.offset(local)
    rows = jnp.arange(logits.shape[0])[:, None]
    if batch.output_counts is not None:
        logits = _dense_penalties(logits, batch)
        return _min_new_tokens(logits, batch, rows, offset)

    seen = jnp.concatenate([batch.prompt_ids, batch.output_ids], axis=1) - offset
    seen_at, _ = _scatter_index(seen, local)
    z = _gather(logits, seen)
    p = batch.repetition_penalty[:, None]
    logits = logits.at[rows, seen_at].set(jnp.where(z > 0, z / p, z * p), mode="drop")

    out_at, _ = _scatter_index(batch.output_ids - offset, local)
    z = _gather(logits, batch.output_ids - offset)
    logits = logits.at[rows, out_at].set(z - batch.presence_penalty[:, None], mode="drop")
    logits = logits.at[rows, out_at].add(
        jnp.broadcast_to(-batch.frequency_penalty[:, None], out_at.shape), mode="drop"
    )

    return _min_new_tokens(logits, batch, rows, offset)


def occurrence_tables(
    prompt_ids: Int[Array, "batch prompt_len"],
    output_ids: Int[Array, "batch output_len"],
    vocab: int,
) -> tuple[Bool[Array, "batch vocab"], Int[Array, "batch vocab"]]:
    """(`seen`: the id occurs in prompt or output, `output_counts`: occurrences in the output)
    of each row's ids; padding ids are ignored."""
    rows = jnp.arange(prompt_ids.shape[0])[:, None]
    both = jnp.concatenate([prompt_ids, output_ids], axis=1)
    seen = jnp.zeros((prompt_ids.shape[0], vocab), bool)
    seen = seen.at[rows, _scatter_index(both, vocab)[0]].set(True, mode="drop")
    counts = jnp.zeros((prompt_ids.shape[0], vocab), jnp.int32)
    counts = counts.at[rows, _scatter_index(output_ids, vocab)[0]].add(1, mode="drop")
    return seen, counts


def _dense_penalties(logits: Float[Array, "batch vocab"], batch: SamplingBatch) -> Array:
    p = batch.repetition_penalty[:, None]
    z = jnp.where(batch.seen, jnp.where(logits > 0, logits / p, logits * p), logits)
    counts = batch.output_counts
    return (
        z
        - jnp.where(counts > 0, batch.presence_penalty[:, None], 0.0)
        - batch.frequency_penalty[:, None] * counts.astype(jnp.float32)
    )


def _min_new_tokens(logits: Array, batch: SamplingBatch, rows: Array, offset) -> Array:
    local = logits.shape[-1]
    too_early = (batch.num_generated < batch.min_new_tokens)[:, None]
    stop_at, stop_ok = _scatter_index(batch.stop_token_ids - offset, local)
    stop_at = jnp.where(too_early & stop_ok, stop_at, local)
    return logits.at[rows, stop_at].set(-jnp.inf, mode="drop")


def _scatter_index(ids: Int[Array, "batch n"], columns: int) -> tuple[Array, Array]:
    """Column indices (ids less the shard's offset) with those outside `[0, columns)` moved
    out of range (dropped by `mode="drop"`), and the in-range mask. Padding ids (`NO_TOKEN`)
    are negative before the offset is taken off, so they fall outside on every shard."""
    ok = (ids >= 0) & (ids < columns)
    return jnp.where(ok, ids, columns), ok


def _gather(logits: Float[Array, "batch vocab"], columns: Int[Array, "batch n"]) -> Array:
    return jnp.take_along_axis(logits, jnp.clip(columns, 0, logits.shape[-1] - 1), axis=1)
