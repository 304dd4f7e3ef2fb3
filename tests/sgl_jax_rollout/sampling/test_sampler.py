"""The jitted sampler against the float64 numpy reference, every mode, mixed batches."""

from __future__ import annotations

import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout.sampling import SamplerConfig, SamplingOptions, make_batch, sample
from tests.sgl_jax_rollout.sampling.numpy_reference import entropy, reference_row, top_k_entropy

VOCAB = 300
EOS = 7
RTOL = 1e-5
# f32 arithmetic near 0: an absolute floor for values like log(0.99999).
ATOL = 2e-6

ROWS = [
    SamplingOptions(seed=1),
    SamplingOptions(seed=2, temperature=0.0),
    SamplingOptions(seed=3, top_k=20, top_p=0.9),
    SamplingOptions(seed=4, top_p=0.5, temperature=0.7),
    SamplingOptions(seed=5, min_p=0.1, temperature=0.7),
    SamplingOptions(seed=6, repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.3),
    SamplingOptions(seed=7, repetition_penalty=0.8, frequency_penalty=-0.4, top_k=5),
    # top-k beyond the candidates, and top-p over a flat row: the exact-search path.
    SamplingOptions(seed=8, top_k=120, top_p=0.95),
    SamplingOptions(seed=9, top_p=0.97, temperature=1.3),
    SamplingOptions(seed=10, min_new_tokens=5, temperature=0.9),
    SamplingOptions(seed=11, temperature=0.0, repetition_penalty=2.0),
    SamplingOptions(seed=12, top_k=3, min_p=0.3, presence_penalty=1.0),
]
PROMPTS = [[1, 2, 3, 2], [10, 11], [5], [], [30, 31, 32], [40], [41, 42], [], [9], [8], [1], [2]]
OUTPUTS = [
    [4, 4, 5],
    [],
    [6],
    [12, 12, 12],
    [1],
    [40, 40, 41, 2],
    [7, 8],
    [],
    [3],
    [EOS, 1],
    [],
    [3],
]


def _logits(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(ROWS), VOCAB)) * 2.5
    logits[8] *= 0.05  # nearly flat: top-p 0.97 needs most of the vocabulary
    logits[3, 100:200] = -np.inf  # partly masked row
    logits[4, 17] += 40.0  # fully peaked row
    # Make sure every penalised id matters: give them large logits.
    for i, ids in enumerate(OUTPUTS):
        logits[i, ids] += 3.0
    return logits.astype(np.float32)


def _run(config: SamplerConfig, logits: np.ndarray):
    batch = make_batch(
        ROWS, vocab_size=VOCAB, prompt_ids=PROMPTS, output_ids=OUTPUTS, eos_token_ids=[EOS]
    )
    return sample(jnp.asarray(logits), batch, config)


MODES = list(itertools.product(("processed", "raw"), ("raw", "processed"), (0, 7)))


@pytest.mark.parametrize(("logprobs_mode", "entropy_source", "entropy_top_k"), MODES)
def test_every_mode_matches_float64_reference(logprobs_mode, entropy_source, entropy_top_k):
    # candidates=16 so rows with top_k=120 or flat top-p go through the exact search.
    config = SamplerConfig(
        logprobs_mode=logprobs_mode,
        entropy_source=entropy_source,
        entropy_top_k=entropy_top_k,
        top_logprobs=3,
        candidates=16,
    )
    logits = _logits()
    out = _run(config, logits)
    tokens = np.asarray(out.tokens)
    for i, opts in enumerate(ROWS):
        ref = reference_row(logits[i], opts, PROMPTS[i], OUTPUTS[i], [EOS])
        assert np.isfinite(ref.processed_logprobs[tokens[i]]), f"row {i} sampled a dropped token"
        if opts.temperature == 0:
            assert tokens[i] == np.argmax(ref.penalised)
        want = ref.processed_logprobs if logprobs_mode == "processed" else ref.raw_logprobs
        np.testing.assert_allclose(out.logprobs[i], want[tokens[i]], rtol=RTOL, atol=ATOL)

        dist = ref.processed_logprobs if entropy_source == "processed" else ref.raw_logprobs
        want_h = top_k_entropy(dist, entropy_top_k) if entropy_top_k else entropy(dist)
        np.testing.assert_allclose(out.entropy[i], want_h, rtol=RTOL, atol=ATOL)

        order = np.argsort(-want, kind="stable")[:3]
        np.testing.assert_allclose(out.top_logprobs[i], want[order], rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(
            np.asarray(out.top_logprob_ids[i])[np.isfinite(want[order])],
            order[np.isfinite(want[order])],
        )


def test_greedy_rows_in_mixed_batch_return_argmax():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(16, VOCAB)).astype(np.float32)
    rows = [
        SamplingOptions(seed=i, temperature=0.0 if i % 2 else 1.0, top_k=-1 if i % 3 else 10)
        for i in range(16)
    ]
    out = sample(jnp.asarray(logits), make_batch(rows, vocab_size=VOCAB), SamplerConfig())
    greedy = np.arange(16) % 2 == 1
    np.testing.assert_array_equal(np.asarray(out.tokens)[greedy], logits[greedy].argmax(-1))


def test_seeded_row_draws_the_same_token_whatever_the_batch():
    rng = np.random.default_rng(6)
    row = rng.normal(size=VOCAB).astype(np.float32)
    target = SamplingOptions(seed=1234, top_p=0.9)
    alone = sample(jnp.asarray(row[None]), make_batch([target], vocab_size=VOCAB))
    for others in (3, 7):
        logits = np.concatenate([row[None], rng.normal(size=(others, VOCAB)).astype(np.float32)])
        rows = [target] + [SamplingOptions(seed=i, top_k=5) for i in range(others)]
        out = sample(jnp.asarray(logits), make_batch(rows, vocab_size=VOCAB))
        assert int(out.tokens[0]) == int(alone.tokens[0])
        np.testing.assert_allclose(out.logprobs[0], alone.logprobs[0], rtol=1e-6)


def test_entropy_bounds_full_and_top_k():
    rng = np.random.default_rng(7)
    logits = jnp.asarray(rng.normal(size=(8, VOCAB)).astype(np.float32) * 0.01)
    rows = [SamplingOptions(seed=i) for i in range(8)]
    batch = make_batch(rows, vocab_size=VOCAB)
    full = sample(logits, batch, SamplerConfig())
    top = sample(logits, batch, SamplerConfig(entropy_top_k=10))
    assert np.all(np.asarray(full.entropy) <= np.log(VOCAB) + 1e-5)
    assert np.all(np.asarray(top.entropy) <= np.log(10) + 1e-5)
    # Nearly uniform logits: both bounds are nearly reached.
    assert np.all(np.asarray(full.entropy) > np.log(VOCAB) - 1e-3)
    assert np.all(np.asarray(top.entropy) > np.log(10) - 1e-3)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_masked_and_peaked_rows_give_finite_outputs(dtype):
    logits = np.full((4, VOCAB), -np.inf, np.float32)
    logits[0, :3] = [1.0, 2.0, 3.0]  # almost everything masked
    logits[1, :] = 0.0
    logits[1, 5] = 1e4  # fully peaked
    logits[2, :] = np.linspace(-5, 5, VOCAB)
    logits[3, 10:20] = 0.0
    rows = [
        SamplingOptions(seed=1, top_p=0.9),
        SamplingOptions(seed=2, temperature=0.0),
        SamplingOptions(seed=3, min_p=0.5, temperature=0.5),
        SamplingOptions(seed=4, top_k=50),
    ]
    for config in (
        SamplerConfig(),
        SamplerConfig(entropy_source="processed", logprobs_mode="raw", entropy_top_k=20),
    ):
        out = sample(jnp.asarray(logits, dtype=dtype), make_batch(rows, vocab_size=VOCAB), config)
        assert np.all(np.isfinite(np.asarray(out.logprobs)))
        assert np.all(np.isfinite(np.asarray(out.entropy)))
        assert np.all(np.isfinite(np.asarray(logits)[np.arange(4), np.asarray(out.tokens)]))
    assert int(out.tokens[1]) == 5


def test_padded_vocab_ids_are_never_sampled():
    logits = np.zeros((4, VOCAB), np.float32)
    logits[:, 250:] = 5.0  # padding ids look attractive
    rows = [SamplingOptions(seed=i) for i in range(4)]
    config = SamplerConfig(valid_vocab_size=250)
    out = sample(jnp.asarray(logits), make_batch(rows, vocab_size=VOCAB), config)
    assert np.all(np.asarray(out.tokens) < 250)
    np.testing.assert_allclose(out.logprobs, -np.log(250), rtol=1e-6)


def test_top_p_on_a_top_k_set_tied_with_the_sentinel_keeps_every_tie():
    """k = 3 over values 5, 4 and ten 3s: the top-k set is 12 tokens, but the candidates (4 +
    the sentinel) hold only 3 of the ties, so top-p must not be settled from their mass
    (which would keep only the 5 and the 4)."""
    logits = np.full((1, VOCAB), -5.0, np.float32)
    logits[0, 10], logits[0, 20], logits[0, 30:40] = 5.0, 4.0, 3.0
    row = SamplingOptions(seed=3, top_k=3, top_p=0.6)
    config = SamplerConfig(candidates=4, entropy_source="processed")
    ref = reference_row(logits[0], row)
    assert np.isfinite(ref.processed_logprobs).sum() == 12
    for seed in range(8):
        batch = make_batch([dataclasses.replace(row, seed=seed)], vocab_size=VOCAB)
        out = sample(jnp.asarray(logits), batch, config)
        token = int(out.tokens[0])
        np.testing.assert_allclose(
            out.logprobs[0], ref.processed_logprobs[token], rtol=RTOL, atol=ATOL
        )
        np.testing.assert_allclose(
            out.entropy[0], entropy(ref.processed_logprobs), rtol=RTOL, atol=ATOL
        )


def test_min_p_row_larger_than_the_candidates_matches_reference():
    """min-p's threshold is known from the row maximum: a kept set beyond the candidates is
    drawn over the vocabulary with it (no search), with exact outputs."""
    rng = np.random.default_rng(11)
    logits = (rng.normal(size=(1, VOCAB)) * 0.3).astype(np.float32)
    row = SamplingOptions(seed=5, min_p=0.2)
    config = SamplerConfig(candidates=8, entropy_source="processed")
    ref = reference_row(logits[0], row)
    assert np.isfinite(ref.processed_logprobs).sum() > 9
    out = sample(jnp.asarray(logits), make_batch([row], vocab_size=VOCAB), config)
    token = int(out.tokens[0])
    want_h = entropy(ref.processed_logprobs)
    np.testing.assert_allclose(out.logprobs[0], ref.processed_logprobs[token], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.entropy[0], want_h, rtol=RTOL, atol=ATOL)
