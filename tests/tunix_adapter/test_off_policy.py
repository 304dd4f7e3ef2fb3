"""Off-policy correction weights and forking-token masks against per-row float64 references
written from the formulas (docs/design.md section 5b), and the settings' errors."""

import itertools
import math

import numpy as np
import pytest

from tunix_adapter import forking
from tunix_adapter.learners import RolloutGRPOConfig
from tunix_adapter.off_policy import OffPolicyCorrection, apply_correction

LEVELS = ("token", "sequence", "geometric")


def batch(seed=0, rows=6, width=9):
    rng = np.random.default_rng(seed)
    mask = rng.random((rows, width)) < 0.75
    mask[0] = False  # an empty completion
    mask[1] = True
    rollout = -rng.exponential(1.0, (rows, width))
    trainer = rollout + rng.normal(0, 0.4, (rows, width))
    garbage = np.where(mask, 0.0, 1e3)  # off-mask values must never count
    return trainer + garbage, rollout - garbage, mask


def reference(trainer, rollout, mask, level, mode, upper, lower, ratio_in_loss):
    out = np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        positions = [t for t in range(mask.shape[1]) if mask[i, t]]
        deltas = [float(trainer[i, t]) - float(rollout[i, t]) for t in positions]
        for t, delta in zip(positions, deltas, strict=True):
            if level == "token":
                log_r = delta
            elif level == "sequence":
                log_r = math.fsum(deltas)
            else:
                log_r = math.fsum(deltas) / len(deltas)
            r = math.exp(min(max(log_r, -20.0), 20.0))
            if mode == "truncate":
                out[i, t] = min(r, upper)
            else:
                inside = lower <= r <= upper
                out[i, t] = (1.0 if ratio_in_loss else r) if inside else 0.0
    return out


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("mode", "upper", "lower"), [("truncate", 1.5, None), ("mask", 1.8, 0.7)])
def test_weights_match_the_formula_of_each_variant(level, mode, upper, lower):
    trainer, rollout, mask = batch()
    correction = OffPolicyCorrection(level=level, mode=mode, upper=upper, lower=lower)
    loss_mask, got = apply_correction(trainer, rollout, mask, correction, ratio_in_loss=False)
    np.testing.assert_array_equal(loss_mask, mask)  # zero_weight: every token stays
    want = reference(trainer, rollout, mask, level, mode, upper, lower or 1 / upper, False)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    assert np.all(got[~mask] == 0)
    # the bounds bite somewhere and keep something (the test would pass vacuously otherwise)
    assert (
        np.sum(got[mask] != reference(trainer, rollout, mask, level, mode, 1e9, 0, False)[mask]) > 0
    )
    assert np.any(got[mask] > 0)


@pytest.mark.parametrize(
    ("level", "upper"), [("token", 1.5), ("sequence", 2.0), ("geometric", 1.1)]
)
def test_a_mask_with_rollout_logprobs_as_old_policy_rejects_only(level, upper):
    trainer, rollout, mask = batch(1)
    correction = OffPolicyCorrection(level=level, mode="mask", upper=upper)
    _, got = apply_correction(trainer, rollout, mask, correction, ratio_in_loss=True)
    want = reference(trainer, rollout, mask, level, "mask", upper, 1 / upper, True)
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(got[mask])) == {0.0, 1.0}
    with pytest.raises(ValueError, match="correct twice"):
        apply_correction(
            trainer, rollout, mask, OffPolicyCorrection(level=level), ratio_in_loss=True
        )


def test_tis_cap_is_token_truncate():
    trainer = np.log(np.array([[0.5, 0.2, 0.9, 0.3]]))
    rollout = np.log(np.array([[0.25, 0.4, 0.1, 0.3]]))
    mask = np.array([[True, True, True, False]])
    config = RolloutGRPOConfig(num_generations=2, use_rollout_logprobs=False, tis_cap=2.5)
    correction = config.off_policy_correction()
    assert correction == OffPolicyCorrection(level="token", mode="truncate", upper=2.5)
    _, got = apply_correction(trainer, rollout, mask, correction, ratio_in_loss=False)
    np.testing.assert_allclose(got, [[2.0, 0.5, 2.5, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ratio_in_loss", [False, True])
def test_response_mask_rejection_takes_rejected_tokens_out_of_the_loss_mask(level, ratio_in_loss):
    """verl's semantics: the completion mask loses the rejected tokens; the kept ones carry
    the same weights as with TRL's zero weights."""
    trainer, rollout, mask = batch(2)
    upper, lower = {"token": (1.5, 0.6), "sequence": (2.0, 0.4), "geometric": (1.1, 0.9)}[level]
    verl = OffPolicyCorrection(level, "mask", upper, lower, rejection="response_mask")
    trl = OffPolicyCorrection(level, "mask", upper, lower)
    loss_mask, weights = apply_correction(trainer, rollout, mask, verl, ratio_in_loss)
    trl_mask, trl_weights = apply_correction(trainer, rollout, mask, trl, ratio_in_loss)
    want = reference(trainer, rollout, mask, level, "mask", upper, lower, ratio_in_loss)
    np.testing.assert_array_equal(trl_mask, mask)
    np.testing.assert_array_equal(loss_mask, mask & (want > 0))
    assert 0 < loss_mask.sum() < mask.sum()  # something rejected, something kept
    np.testing.assert_allclose(weights, np.where(loss_mask, want, 0.0), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(weights, trl_weights)


def test_parse_accepts_trl_spelling_and_names_the_choices():
    assert OffPolicyCorrection.parse("sequence_mask", 3.0, 0.5) == OffPolicyCorrection(
        level="sequence", mode="mask", upper=3.0, lower=0.5
    )
    with pytest.raises(ValueError, match="token-truncate"):
        OffPolicyCorrection.parse("seq-clip")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"is_correction": "token-truncate"}, "use_rollout_logprobs=False"),
        ({"tis_cap": 2.0}, "use_rollout_logprobs=False"),
        ({"is_correction": "token-mask", "is_threshold": 0.5}, "is_threshold must be"),
        ({"is_correction": "token-mask", "is_threshold_lower": 1.5}, r"in \[0, 1\]"),
        (
            {
                "is_correction": "token-truncate",
                "is_threshold_lower": 0.5,
                "use_rollout_logprobs": False,
            },
            "only applies to a mask",
        ),
        ({"is_correction": "tokens-mask"}, "is_correction must be one of"),
        ({"is_correction": "token-mask", "is_rejection": "drop"}, "is_rejection must be one of"),
        ({"is_rejection": "response_mask"}, "needs a mask correction"),
        (
            {
                "is_correction": "token-truncate",
                "is_rejection": "response_mask",
                "use_rollout_logprobs": False,
            },
            "only applies to a mask correction",
        ),
        (
            {"tis_cap": 2.0, "is_correction": "token-mask", "use_rollout_logprobs": False},
            "not both",
        ),
        ({"top_entropy_quantile": 0.0}, r"top_entropy_quantile must be in \(0, 1\]"),
        ({"top_entropy_quantile": 1.2}, r"top_entropy_quantile must be in \(0, 1\]"),
        ({"pass_threshold": float("nan")}, "pass_threshold"),
    ],
)
def test_config_refuses_incompatible_or_out_of_range_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutGRPOConfig(num_generations=2, **kwargs)


def test_mask_corrections_are_allowed_with_either_old_policy():
    for use_rollout in (True, False):
        config = RolloutGRPOConfig(
            num_generations=2, use_rollout_logprobs=use_rollout, is_correction="geometric-mask"
        )
        assert config.off_policy_correction().lower_bound == 0.5


def test_top_entropy_mask_keeps_the_top_quantile_of_completion_tokens():
    rng = np.random.default_rng(3)
    mask = rng.random((5, 40)) < 0.8
    # float32, as the rollout returns it; padding is ignored
    entropy = np.where(mask, rng.exponential(1.0, mask.shape), 99.0).astype(np.float32)
    for rho in (0.2, 0.5, 1.0):
        kept, threshold = forking.top_entropy_mask(entropy, mask, rho)
        values = np.sort(entropy[mask].astype(np.float64))
        # linear-interpolated (1 - rho) quantile, from its definition on the sorted values
        position = (1 - rho) * (len(values) - 1)
        low = int(np.floor(position))
        want = values[low] + (position - low) * (
            values[min(low + 1, len(values) - 1)] - values[low]
        )
        assert threshold == pytest.approx(want, rel=1e-12)
        np.testing.assert_array_equal(kept, mask & (entropy >= want))
        assert abs(kept.sum() - rho * mask.sum()) <= 1
    kept, _ = forking.top_entropy_mask(entropy, mask, 1.0)
    np.testing.assert_array_equal(kept, mask)


def test_pass_at_k_is_the_unbiased_estimator():
    from tunix_adapter.metrics import pass_at_k

    for n, c, k in itertools.product(range(1, 7), range(0, 7), range(1, 7)):
        if c > n or k > n:
            continue
        subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
        want = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(c, n, k) == pytest.approx(want, abs=1e-12)
