"""EGPO advantage (docs/design.md section 5) against hand-computed values and its properties."""

import numpy as np
import pytest

from tunix_adapter.egpo import (
    EgpoSettings,
    compute_egpo_advantages,
    egpo_advantages,
    estimator_inputs,
    think_span_entropy,
    think_span_mask,
)

S, E = 4, 5  # think-start / think-end ids of the built-in model


def test_formula_matches_a_hand_computed_example():
    rewards = np.array([1.0, 0.0, 1.0, 1.0])
    entropy_mean = np.array([0.3, 2.0, 1.0, 1.0])
    got = egpo_advantages(rewards, 2, entropy_mean, EgpoSettings())
    a = 0.5 / (np.sqrt(0.5) + 1e-6)  # tunix's GRPO: (r - mean) / (std(ddof=1) + 1e-6)
    expected = [a + 0.4 * 0.3, -a + 0.4 * (a / 2.0), 0.0, 0.0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_zero_variance_groups_keep_zero_advantage():
    rewards = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    got = egpo_advantages(rewards, 3, np.full(6, 5.0), EgpoSettings(egpo_lambda=0.9))
    np.testing.assert_array_equal(got, np.zeros(6))


def test_sign_never_flips_when_lambda_is_below_alpha():
    rng = np.random.default_rng(0)
    for _ in range(500):
        g = int(rng.integers(2, 9))
        rewards = rng.integers(0, 2, size=4 * g).astype(float) * rng.uniform(0.1, 3)
        alpha = float(rng.uniform(1.0001, 10))
        settings = EgpoSettings(egpo_lambda=float(rng.uniform(0, alpha * 0.999)), egpo_alpha=alpha)
        entropy = rng.exponential(rng.uniform(0.01, 20), size=4 * g)
        grpo = egpo_advantages(rewards, g, np.zeros(4 * g), settings)
        got = egpo_advantages(rewards, g, entropy, settings)
        assert np.all(np.sign(got) == np.sign(grpo))


def test_think_span_is_strictly_inside_the_tags_and_falls_back_to_the_completion():
    pad = 0
    ids = np.array(
        [
            [9, S, 10, 11, E, 12, pad, pad],  # span: 10, 11
            [13, 14, 15, pad, pad, pad, pad, pad],  # no tags: whole completion
            [S, 16, 17, 18, pad, pad, pad, pad],  # unclosed: whole completion
            [S, E, 19, pad, pad, pad, pad, pad],  # empty span
        ]
    )
    mask = ids != pad
    span = think_span_mask(ids, mask, S, E)
    assert span[0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    assert span[1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert span[2].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert span[3].tolist() == [0] * 8
    entropy = np.arange(1, 33, dtype=float).reshape(4, 8)
    entropy[~mask] = 1e9  # padding must never count
    got = think_span_entropy(entropy, ids, mask, EgpoSettings(think_start_id=S, think_end_id=E))
    np.testing.assert_allclose(got, [(3 + 4) / 2, (9 + 10 + 11) / 3, (17 + 18 + 19 + 20) / 4, 0])


def test_without_think_ids_the_whole_unpadded_completion_counts():
    ids = np.array([[S, 7, E, 0]])
    got = think_span_entropy(np.array([[1.0, 2.0, 3.0, 100.0]]), ids, ids != 0, EgpoSettings())
    np.testing.assert_allclose(got, [2.0])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"egpo_alpha": 1.0}, "egpo_alpha"),
        ({"egpo_alpha": 0.5}, "egpo_alpha"),
        ({"egpo_lambda": -0.1}, "egpo_lambda"),
        ({"egpo_lambda": 2.0, "egpo_alpha": 2.0}, "egpo_lambda"),
        ({"think_start_id": 4}, "think_start_id"),
    ],
)
def test_bad_settings_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EgpoSettings(**kwargs)


def test_registered_estimator_uses_the_entropy_it_is_given_and_refuses_without():
    from sgl_jax_rollout import tunix_compat

    estimator = tunix_compat.get_advantage_estimator("egpo")
    assert estimator is compute_egpo_advantages
    rewards = np.array([1.0, 0.0])
    with pytest.raises(ValueError, match="needs the rollout entropy"):
        estimator(rewards=rewards, num_generations=2)
    with estimator_inputs(np.array([0.1, 0.2]), EgpoSettings()):
        got = estimator(rewards=rewards, num_generations=2)
    np.testing.assert_allclose(
        got, egpo_advantages(rewards, 2, np.array([0.1, 0.2]), EgpoSettings())
    )
