"""The sampler's per-slot device state against the host's own bookkeeping: after joins and
steps in any order, each slot holds its request's generated count and the occurrence tables
of its prompt and output ids (what `penalties.occurrence_tables` builds from the full ids)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sgl_jax_rollout.engine.rows import slot_table
from sgl_jax_rollout.engine.slot_state import advanced, joined, new_slot_state
from sgl_jax_rollout.sampling import make_batch
from sgl_jax_rollout.sampling.batch import token_id_table
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.sampling.penalties import occurrence_tables

VOCAB = 32
SLOTS = 6
ROWS = 4


def _step(state, requests, joining):
    """One batch of `requests` (dicts with slot, prompt, output; None = padding): joins or
    reads the state, 'samples' a token per row, advances; returns the new state and the
    batch the sampler saw."""
    specs = [SamplingOptions(seed=0) for _ in range(ROWS)]
    batch = make_batch(specs, vocab_size=VOCAB)
    prompts = [r["prompt"] if (r and joining) else [] for r in requests] + [[]] * (
        ROWS - len(requests)
    )
    outputs = [r["output"] if (r and joining) else [] for r in requests] + [[]] * (
        ROWS - len(requests)
    )
    batch = dataclasses.replace(
        batch,
        num_generated=jnp.asarray([len(o) for o in outputs], jnp.int32),
        prompt_ids=jnp.asarray(token_id_table(prompts, 16)),
        output_ids=jnp.asarray(token_id_table(outputs, 16)),
    )
    slots = jnp.asarray(slot_table([r and r["slot"] for r in requests], joining, ROWS))
    slot, join = slots[:, 0], slots[:, 1] != 0
    seen_batch = jax.jit(joined)(state, batch, slot, join)
    tokens = jnp.asarray([r["next"] if r else 0 for r in requests] + [0] * (ROWS - len(requests)))
    return jax.jit(advanced)(state, seen_batch, slot, tokens), seen_batch


def test_slots_track_each_request_through_joins_and_steps():
    rng = np.random.default_rng(0)
    state = new_slot_state(SLOTS, VOCAB, jax.devices()[0])
    requests = [
        {"slot": s, "prompt": rng.integers(0, VOCAB, n).tolist(), "output": []}
        for s, n in ((4, 5), (0, 1), (2, 9))
    ]
    requests[2]["output"] = [3, 3, 7]  # a retracted request joining again with its output
    for step in range(6):
        joining = step in (0, 3)
        if step == 3:  # slot 0's request ends; a new one takes its slot and joins
            requests[1] = {"slot": 0, "prompt": [1, 1, 2], "output": []}
        batch_reqs = [dict(r, next=int(rng.integers(0, VOCAB))) for r in requests]
        order = rng.permutation(len(batch_reqs)).tolist()  # rows in any order, padding between
        rows = [batch_reqs[order[0]], None, batch_reqs[order[1]], batch_reqs[order[2]]]
        state, seen = _step(state, rows, joining)
        for i, r in enumerate(rows):
            if r is None:
                continue
            want_seen, want_counts = occurrence_tables(
                jnp.asarray(token_id_table([r["prompt"]], 16)),
                jnp.asarray(token_id_table([r["output"]], 16)),
                VOCAB,
            )
            assert int(seen.num_generated[i]) == len(r["output"])
            np.testing.assert_array_equal(seen.seen[i], want_seen[0])
            np.testing.assert_array_equal(seen.output_counts[i], want_counts[0])
        for r, b in zip(requests, batch_reqs, strict=True):
            r["output"] = r["output"] + [b["next"]]


def test_without_tables_only_the_count_is_kept():
    state = new_slot_state(SLOTS, None, jax.devices()[0]).without_tables()
    batch = make_batch([SamplingOptions(seed=0)] * 2, vocab_size=VOCAB)
    batch = dataclasses.replace(batch, num_generated=jnp.asarray([5, 0]))
    slot, join = jnp.asarray([1, 3]), jnp.asarray([True, False])
    seen = joined(state, batch, slot, join)
    assert seen.num_generated.tolist() == [5, 0] and seen.output_counts is None
    state = advanced(state, seen, slot, jnp.asarray([2, 2]))
    assert state.num_generated[jnp.asarray([1, 3])].tolist() == [6, 1]
    assert state.seen is None
