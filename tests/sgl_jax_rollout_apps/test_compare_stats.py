"""The comparison report's statistics on synthetic inputs, against direct computations."""

import numpy as np
import pytest

from sgl_jax_rollout_apps.compare_stats import (
    first_divergence,
    greedy_agreement,
    logprob_fidelity,
    median_throughput,
    position_tv,
    total_variation,
)


def test_first_divergence_and_agreement():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 7]) == 2  # one stopped earlier
    report = greedy_agreement([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [6]])
    assert report == {"agreement": pytest.approx(1 / 3), "first_divergence": [None, 1, 0]}
    with pytest.raises(ValueError, match="same, non-zero number"):
        greedy_agreement([[1]], [])


def test_logprob_fidelity_over_real_tokens_only():
    rollout = [[-1.0, -2.0], [-0.5]]
    trainer = [[-1.1, -2.0, -9.0], [-0.25, 0.0, 0.0]]  # padded past each completion
    report = logprob_fidelity(rollout, trainer)
    assert report["tokens"] == 3
    assert report["max_abs_diff"] == pytest.approx(0.25)
    assert report["mean_abs_diff"] == pytest.approx((0.1 + 0.0 + 0.25) / 3)


def test_total_variation_matches_the_definition():
    assert total_variation([1, 1, 2, 2], [1, 2, 1, 2]) == 0.0
    assert total_variation([1, 1], [2, 2]) == 1.0
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 200), rng.integers(0, 7, 300)
    pa = np.bincount(a, minlength=7) / 200
    pb = np.bincount(b, minlength=7) / 300
    assert total_variation(a, b) == pytest.approx(0.5 * np.abs(pa - pb).sum())


def test_tv_separates_a_sampling_bug_from_noise():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(50))
    hot = np.log(p) / 0.7  # a sampler that forgot to divide by the temperature
    q = np.exp(hot - hot.max())
    q /= q.sum()
    same = [rng.choice(50, 4000, p=p) for _ in range(2)]
    other = rng.choice(50, 4000, p=q)
    noise = total_variation(*same)
    assert noise < 0.06
    assert total_variation(same[0], other) > noise + 0.05


def test_position_tv_per_position_with_sample_sizes():
    a = [[1, 2, 3], [1, 3], [1]]
    b = [[1, 2], [2, 2], [1, 3, 3]]
    report = position_tv(a, b, positions=4)
    rows = report["per_position"]
    assert [r["position"] for r in rows] == [0, 1, 2]  # position 3 is empty on both sides
    assert rows[0] == {"position": 0, "tv": pytest.approx(1 / 3), "n_a": 3, "n_b": 3}
    assert rows[1]["tv"] == pytest.approx(total_variation([2, 3], [2, 2, 3]))
    assert (rows[2]["n_a"], rows[2]["n_b"]) == (1, 1)
    assert report["mean_tv"] == pytest.approx(np.mean([r["tv"] for r in rows]))


def test_median_throughput_needs_three_runs():
    assert median_throughput([100, 100, 100], [1.0, 2.0, 0.5]) == 100.0
    with pytest.raises(ValueError, match=">= 3 runs"):
        median_throughput([1, 2], [1.0, 1.0])
