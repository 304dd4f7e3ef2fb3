"""Penalties against their formulas: Hugging Face's repetition penalty, OpenAI's frequency and
presence penalties, and min_new_tokens; each test runs on both inputs of `apply_penalties`:
token-id arrays and the dense occurrence tables the engine keeps per request."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout.sampling import SamplingOptions, make_batch
from sgl_jax_rollout.sampling.penalties import apply_penalties, occurrence_tables
from tests.sgl_jax_rollout.sampling.numpy_reference import hf_repetition_penalty

VOCAB = 64
_INPUT = {"which": "token_ids"}


@pytest.fixture(params=["token_ids", "dense_tables"], autouse=True)
def penalty_input(request, monkeypatch):
    """Which input `_penalise` hands `apply_penalties`."""
    monkeypatch.setitem(_INPUT, "which", request.param)


def _penalise(logits, rows, prompts, outputs, eos=()):
    batch = make_batch(
        rows, vocab_size=VOCAB, prompt_ids=prompts, output_ids=outputs, eos_token_ids=eos
    )
    if _INPUT["which"] == "dense_tables":
        seen, counts = occurrence_tables(batch.prompt_ids, batch.output_ids, VOCAB)
        batch = dataclasses.replace(
            batch, prompt_ids=None, output_ids=None, seen=seen, output_counts=counts
        )
    return np.asarray(apply_penalties(jnp.asarray(logits), batch))


def test_repetition_penalty_matches_hugging_face_formula():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, VOCAB)).astype(np.float32) * 3
    prompts = [[1, 2, 2, 3], [5], []]
    outputs = [[3, 4, 4], [], [9, 9, 10]]
    rows = [SamplingOptions(seed=0, repetition_penalty=p) for p in (1.3, 0.7, 2.0)]
    got = _penalise(logits, rows, prompts, outputs)
    for i, row in enumerate(rows):
        want = hf_repetition_penalty(
            logits[i].astype(np.float64), prompts[i] + outputs[i], row.repetition_penalty
        )
        np.testing.assert_allclose(got[i], want, rtol=1e-6)
    assert not np.allclose(got, logits)


def test_frequency_and_presence_follow_openai_formula():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, VOCAB)).astype(np.float32)
    outputs = [[4, 4, 4, 7], [1, 2, 1]]
    prompts = [[4, 20], [30]]  # prompt ids get no frequency / presence penalty
    rows = [
        SamplingOptions(seed=0, frequency_penalty=0.5, presence_penalty=0.25),
        SamplingOptions(seed=0, frequency_penalty=-0.3, presence_penalty=1.5),
    ]
    got = _penalise(logits, rows, prompts, outputs)
    for i, row in enumerate(rows):
        counts = np.bincount(outputs[i], minlength=VOCAB)
        want = logits[i] - row.frequency_penalty * counts - row.presence_penalty * (counts > 0)
        np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-6)


def test_min_new_tokens_masks_stop_ids_until_reached():
    logits = np.zeros((3, VOCAB), np.float32)
    rows = [
        SamplingOptions(seed=0, min_new_tokens=3, stop_token_ids=[11]),
        SamplingOptions(seed=0, min_new_tokens=2),  # already has 2 tokens
        SamplingOptions(seed=0, min_new_tokens=5, ignore_eos=True),
    ]
    got = _penalise(logits, rows, [[], [], []], [[1], [1, 2], []], eos=[9])
    assert np.isneginf(got[0, [9, 11]]).all()
    assert np.isfinite(got[1]).all()
    assert np.isneginf(got[2]).sum() == 0  # eos ignored, no own stop ids
    assert np.isfinite(np.delete(got[0], [9, 11])).all()


def test_neutral_settings_leave_logits_unchanged():
    logits = np.random.default_rng(2).normal(size=(2, VOCAB)).astype(np.float32)
    rows = [SamplingOptions(seed=0)] * 2
    got = _penalise(logits, rows, [[1, 2], [3]], [[4, 4], []])
    np.testing.assert_array_equal(got, logits)
