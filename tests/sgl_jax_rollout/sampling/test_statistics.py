"""Sampling statistics: 20,000 seeded draws follow the processed distribution (chi-square)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sgl_jax_rollout.sampling import SamplerConfig, SamplingOptions, make_batch, sample
from tests.sgl_jax_rollout.sampling.numpy_reference import reference_row

DRAWS = 20_000
VOCAB = 48


def _draws(logits: np.ndarray, options: SamplingOptions, config: SamplerConfig) -> np.ndarray:
    rows = [options] * DRAWS
    keys = np.stack([np.asarray([0, i], np.uint32) for i in range(DRAWS)])
    batch = make_batch(rows, vocab_size=VOCAB, keys=keys)
    out = sample(jnp.asarray(np.broadcast_to(logits, (DRAWS, VOCAB))), batch, config)
    return np.asarray(out.tokens)


SETTINGS = {
    # untruncated: the two-level draw over the whole vocabulary
    "plain": (SamplingOptions(), SamplerConfig(return_entropy=False)),
    "top_p_0.9_top_k_20": (SamplingOptions(top_p=0.9, top_k=20), SamplerConfig()),
    "min_p_0.1_T_0.7": (SamplingOptions(min_p=0.1, temperature=0.7), SamplerConfig()),
    # kept set larger than the candidates: exact threshold search, then the vocabulary draw
    "top_p_0.95_search": (SamplingOptions(top_p=0.95), SamplerConfig(candidates=4)),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_draws_follow_processed_distribution(name):
    options, config = SETTINGS[name]
    logits = (np.random.default_rng(11).normal(size=VOCAB) * 1.5).astype(np.float32)
    tokens = _draws(logits, options, config)
    probs = np.exp(reference_row(logits, options).processed_logprobs)
    counts = np.bincount(tokens, minlength=VOCAB)
    kept = probs > 0
    assert counts[~kept].sum() == 0, "drew a token outside the kept set"
    assert kept.sum() > 3, "setting too narrow to test anything"
    expected = probs[kept] * DRAWS
    p_value = stats.chisquare(counts[kept], expected).pvalue
    assert p_value > 1e-3, f"{name}: chi-square p={p_value:.2e}"


def test_chi_square_detects_a_wrong_distribution():
    # The same check against the untempered distribution must fail for T=0.7 draws.
    options = SamplingOptions(temperature=0.7)
    logits = (np.random.default_rng(11).normal(size=VOCAB) * 1.5).astype(np.float32)
    tokens = _draws(logits, options, SamplerConfig())
    wrong = np.exp(reference_row(logits, SamplingOptions()).processed_logprobs)
    counts = np.bincount(tokens, minlength=VOCAB)
    assert stats.chisquare(counts, wrong * DRAWS).pvalue < 1e-6
