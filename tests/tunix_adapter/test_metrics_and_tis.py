"""Rollout metrics and truncated importance-sampling weights against numpy formulas."""

import numpy as np

from tunix_adapter.learners import tis_weights
from tunix_adapter.metrics import rollout_metrics


def test_rollout_metrics_use_only_completion_tokens():
    rng = np.random.default_rng(0)
    mask = rng.random((6, 10)) < 0.7
    entropy = rng.exponential(2.0, (6, 10))
    rollout = -rng.exponential(1.0, (6, 10))
    trainer = rollout + rng.normal(0, 0.1, (6, 10))
    garbage = np.where(mask, 0, 1e6)  # off-mask values must never count
    got = rollout_metrics(mask, entropy + garbage, rollout + garbage, trainer)
    h = entropy[mask]
    assert got["rollout/entropy_mean"][0] == np.mean(h)
    for q in (50, 90, 99):
        assert got[f"rollout/entropy_p{q}"][0] == np.percentile(h, q)
    diff = np.abs(rollout - trainer)[mask]
    np.testing.assert_allclose(got["rollout/trainer_logp_abs_diff_mean"][0], diff.mean())
    np.testing.assert_allclose(got["rollout/trainer_logp_abs_diff_max"][0], diff.max())
    assert got["rollout/trainer_logp_abs_diff_max"][1] is np.max
    assert "rollout/trainer_logp_abs_diff_mean" not in rollout_metrics(mask, entropy, rollout)


def test_tis_weights_are_truncated_ratios_on_the_mask():
    trainer = np.log(np.array([[0.5, 0.2, 0.9, 0.3]]))
    rollout = np.log(np.array([[0.25, 0.4, 0.1, 0.3]]))
    mask = np.array([[True, True, True, False]])
    got = tis_weights(trainer, rollout, mask, cap=2.5)
    np.testing.assert_allclose(got, [[2.0, 0.5, 2.5, 0.0]], rtol=1e-6)
    assert got.dtype == np.float32
