"""The sampler's per-request state on the device, one entry per request slot.

Owns `SlotState`: for each request slot (upstream's `req_pool_idx`; the last entry is scratch
for padding rows) the number of tokens its request has generated and, once a batch with
penalties has run, its occurrence tables (`seen`: the id is in the prompt or the output;
`output_counts`: occurrences in the output), `[slots, vocab]`.

Inside the jitted sampler step a row first takes its state (`joined`): a row that joins the
batch (every row of an extend batch, and padding) brings `num_generated` and its ids from the
host, the others read their slot. After the draw every row writes its slot back, advanced by
the token it sampled (`advanced`). So the host never rebuilds per-step values from output
ids, and with overlap scheduling, where the host builds step t + 1 before step t's token is
known, the state is still exact: the device runs the steps in order.

Writes for a slot whose request finished during the overlapped step, or for a non-final
chunk of a chunked prefill, are harmless: the next request in that slot, and the next chunk,
join and overwrite it.

No sgl_jax import (tested without the engine).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from sgl_jax_rollout.sampling.batch import SamplingBatch
from sgl_jax_rollout.sampling.penalties import occurrence_tables


class SlotState(NamedTuple):
    num_generated: Int[Array, " slots"]
    seen: Bool[Array, "slots vocab"] | None = None
    output_counts: Int[Array, "slots vocab"] | None = None

    @property
    def has_tables(self) -> bool:
        return self.seen is not None

    def without_tables(self) -> SlotState:
        return SlotState(self.num_generated)


def new_slot_state(
    request_slots: int, vocab: int | None, sharding: jax.sharding.Sharding
) -> SlotState:
    """Zeroed state for `request_slots` slots plus the scratch one; occurrence tables when
    `vocab` is given."""
    size = request_slots + 1
    state = SlotState(jnp.zeros((size,), jnp.int32))
    if vocab is not None:
        state = SlotState(
            state.num_generated,
            jnp.zeros((size, vocab), bool),
            jnp.zeros((size, vocab), jnp.int32),
        )
    return jax.device_put(state, sharding)


def joined(
    state: SlotState,
    batch: SamplingBatch,
    slot: Int[Array, " batch"],
    join: Bool[Array, " batch"],
) -> SamplingBatch:
    """`batch` with each row's `num_generated` and, if `state` has tables, `seen` /
    `output_counts` in place of its id arrays: from the host for joining rows, from the slot
    for the others."""
    index = _index(state, slot)
    batch = dataclasses.replace(
        batch,
        num_generated=jnp.where(join, batch.num_generated, state.num_generated[index]),
    )
    if not state.has_tables:
        return batch
    seen, counts = occurrence_tables(batch.prompt_ids, batch.output_ids, state.seen.shape[1])
    rows_join = join[:, None]
    return dataclasses.replace(
        batch,
        prompt_ids=None,
        output_ids=None,
        seen=jnp.where(rows_join, seen, state.seen[index]),
        output_counts=jnp.where(rows_join, counts, state.output_counts[index]),
    )


def advanced(
    state: SlotState,
    batch: SamplingBatch,
    slot: Int[Array, " batch"],
    tokens: Int[Array, " batch"],
) -> SlotState:
    """`state` with each row's slot set to its `joined` values advanced by `tokens`."""
    index = _index(state, slot)
    num_generated = state.num_generated.at[index].set(batch.num_generated + 1)
    if not state.has_tables:
        return SlotState(num_generated)
    hit = jax.nn.one_hot(tokens, state.seen.shape[1], dtype=jnp.int32)
    return SlotState(
        num_generated,
        state.seen.at[index].set(batch.seen | (hit > 0)),
        state.output_counts.at[index].set(batch.output_counts + hit),
    )


def _index(state: SlotState, slot: Int[Array, " batch"]) -> Int[Array, " batch"]:
    scratch = state.num_generated.shape[0] - 1
    return jnp.where(slot < 0, scratch, slot)
