"""`check` on a model whose vocabulary is longer than its tokenizer: the trainer's log-mass on
the ids the engine never samples (against float64 softmax sums), and the engine settings it
asks for short prompts, and the bfloat16 limit the floor sets."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_adapter.check_config import CheckConfig, room
from tunix_adapter.check_verdicts import (
    BF16_TOLERANCE,
    F32_TOLERANCE,
    fidelity_limit,
    padded_log_mass,
)


def test_padded_log_mass_is_what_renormalising_over_the_tokenizer_ids_adds():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 10)).astype(np.float32) * 4
    logits[1, 2, 7:] += 200.0  # nearly all the mass past the tokenizer: no underflow to inf
    gap = padded_log_mass(logits, valid=7)
    p = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = -np.log(p[..., :7].sum(-1))
    np.testing.assert_allclose(gap[:, :2], expected[:, :2], rtol=1e-12)
    np.testing.assert_allclose(gap[0, 2], expected[0, 2], rtol=1e-12)
    assert np.isfinite(gap).all() and gap[1, 2] > 190.0
    assert (padded_log_mass(logits, valid=10) == 0).all()


def test_room_gives_a_prefill_at_least_the_context_for_short_prompts():
    for prompt_tokens in (1, 16, 64, 1024):
        for max_tokens in (4, 32):
            context, prefill, batch = room(
                CheckConfig(
                    model_path="m",
                    prompts=1,
                    samples=1,
                    prompt_tokens=prompt_tokens,
                    max_tokens=max_tokens,
                )
            )
            assert prefill >= context > prompt_tokens + 16 + max_tokens and batch == 1


def test_the_bfloat16_limit_grows_with_the_trainers_own_spread():
    """`fidelity_limit`: float32 keeps its tolerance; bfloat16 keeps 0.1 over a small floor and
    allows twice the floor over T above it (measured: a bfloat16 Qwen3-0.6B replica's floor
    of 0.049 at 1,025-token prompts with XLA's excess precision off)."""
    assert fidelity_limit(F32_TOLERANCE, 0.5, 0.7) == F32_TOLERANCE
    assert fidelity_limit(BF16_TOLERANCE, 0.003, 1.0) == BF16_TOLERANCE
    assert fidelity_limit(BF16_TOLERANCE, 0.049, 0.7) == pytest.approx(0.14)
    assert fidelity_limit(BF16_TOLERANCE, 0.049, 1.0) == BF16_TOLERANCE
