"""Batch metrics against numpy computations written independently from the formulas (verl's,
tunix main's, Chen et al.'s pass@k)."""

import math

import numpy as np
import pytest

from tunix_adapter import metrics
from tunix_adapter.metrics import rollout_metrics
from tunix_adapter.off_policy import OffPolicyCorrection, correction_weights


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


def mismatch_batch(seed=0):
    rng = np.random.default_rng(seed)
    mask = rng.random((5, 12)) < 0.7
    mask[:, 0] = True
    rollout = -rng.exponential(1.0, mask.shape)
    trainer = rollout + rng.normal(0, 0.3, mask.shape)
    garbage = np.where(mask, 0.0, 50.0)
    return mask, rollout - garbage, trainer + garbage


def value(got, name):
    return got[name][0]


def test_mismatch_metrics_follow_verl_and_tunix_main():
    mask, rollout, trainer = mismatch_batch()
    got = metrics.mismatch_metrics(mask, rollout, trainer)
    r, t = rollout[mask], trainer[mask]
    pr, pt = np.exp(r), np.exp(t)
    diff = np.abs(pr - pt)
    assert value(got, "sampler_trainer/logp_diff_mean") == pytest.approx(np.abs(r - t).mean())
    assert value(got, "sampler_trainer/logp_diff_max") == pytest.approx(np.abs(r - t).max())
    assert value(got, "sampler_trainer/prob_diff_mean") == pytest.approx(diff.mean())
    assert value(got, "sampler_trainer/prob_diff_max") == pytest.approx(diff.max())
    corr = np.corrcoef(pr, pt)[0, 1]
    assert value(got, "sampler_trainer/probs_pearson_corr") == pytest.approx(corr)
    assert value(got, "training/rollout_actor_probs_pearson_corr") == pytest.approx(corr)
    assert value(got, "training/rollout_probs_diff_std") == pytest.approx(np.std(diff, ddof=1))
    assert value(got, "training/rollout_probs_diff_max") == pytest.approx(diff.max())
    # verl's off-policy metrics: per-sequence means first, then the batch mean
    seq_t = [np.mean(trainer[i][mask[i]]) for i in range(len(mask))]
    seq_r = [np.mean(rollout[i][mask[i]]) for i in range(len(mask))]
    log_ppl_diff = np.subtract(seq_r, seq_t)
    assert value(got, "rollout_corr/kl") == pytest.approx(np.mean(r - t))
    assert value(got, "rollout_corr/k3_kl") == pytest.approx(np.mean(np.exp(t - r) - (t - r) - 1))
    assert value(got, "rollout_corr/training_ppl") == pytest.approx(
        np.mean(np.exp(-np.array(seq_t)))
    )
    assert value(got, "rollout_corr/rollout_log_ppl") == pytest.approx(-np.mean(seq_r))
    assert value(got, "rollout_corr/log_ppl_diff") == pytest.approx(log_ppl_diff.mean())
    assert value(got, "rollout_corr/log_ppl_abs_diff") == pytest.approx(np.abs(log_ppl_diff).mean())
    assert value(got, "rollout_corr/ppl_ratio") == pytest.approx(np.exp(log_ppl_diff).mean())
    assert value(got, "rollout_corr/chi2_token") == pytest.approx(np.mean(np.exp(t - r) ** 2) - 1)
    seq_sum = [np.sum(trainer[i][mask[i]] - rollout[i][mask[i]]) for i in range(len(mask))]
    assert value(got, "rollout_corr/chi2_seq") == pytest.approx(
        np.mean(np.exp(2 * np.array(seq_sum))) - 1
    )
    assert got["sampler_trainer/logp_diff_max"][1] is np.max
    assert got["rollout_corr/log_ppl_diff_min"][1] is np.min
    # identical policies: no mismatch anywhere
    same = metrics.mismatch_metrics(mask, rollout, rollout)
    assert value(same, "rollout_corr/kl") == 0 and value(same, "rollout_corr/chi2_seq") == 0
    assert value(same, "sampler_trainer/probs_pearson_corr") == pytest.approx(1.0)


@pytest.mark.parametrize(
    "name", ["token-truncate", "token-mask", "sequence-mask", "geometric-truncate"]
)
def test_correction_metrics_describe_the_applied_weights(name):
    mask, rollout, trainer = mismatch_batch(1)
    upper = {"token": 1.3, "sequence": 2.5, "geometric": 1.05}[name.split("-")[0]]
    correction = OffPolicyCorrection.parse(name, upper)
    weights = correction_weights(trainer, rollout, mask, correction, ratio_in_loss=False)
    got = metrics.correction_metrics(mask, weights, rollout, trainer, correction)
    w = weights[mask].astype(np.float64)
    assert value(got, "sampler_is/weight_mean") == pytest.approx(w.mean())
    assert value(got, "rollout_corr/rollout_is_mean") == pytest.approx(w.mean())
    assert value(got, "sampler_is/weight_max") == pytest.approx(w.max())
    clamped = np.clip(w, 0, correction.upper)
    ess = 1 / np.mean((clamped / clamped.mean()) ** 2)
    assert value(got, "rollout_corr/rollout_is_eff_sample_size") == pytest.approx(ess, rel=1e-6)
    assert value(got, "rollout_corr/rollout_is_std") == pytest.approx(np.std(clamped))
    if correction.level == "token":
        ratio = np.exp(trainer - rollout)[mask]
        high, low = ratio > correction.upper, ratio < correction.lower_bound
    else:  # counted per sequence
        log_r = [np.sum(trainer[i][mask[i]] - rollout[i][mask[i]]) for i in range(len(mask))]
        if correction.level == "geometric":
            log_r = [v / mask[i].sum() for i, v in enumerate(log_r)]
        ratio = np.exp(log_r)
        high, low = ratio > correction.upper, ratio < correction.lower_bound
        assert value(got, "rollout_corr/rollout_is_max") == pytest.approx(ratio.max())
    assert value(got, "rollout_corr/rollout_is_ratio_fraction_high") == pytest.approx(high.mean())
    assert value(got, "rollout_corr/rollout_is_ratio_fraction_low") == pytest.approx(low.mean())
    assert high.any() or low.any()  # the bounds bite in this batch
    if correction.mode == "mask":
        assert value(got, "rollout_corr/rollout_is_oob_ratio") == pytest.approx(np.mean(w == 0))


def test_group_metrics_per_prompt():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.2, 0.0])
    got = metrics.group_metrics(rewards, 4, pass_threshold=0.5)
    groups = rewards.reshape(3, 4)
    passed = (groups >= 0.5).sum(-1)  # 2, 4, 0
    assert value(got, "rewards/pass@1") == pytest.approx(np.mean(passed / 4))
    assert value(got, "rewards/pass@4") == pytest.approx(np.mean(passed > 0))
    assert (
        value(got, "rewards/mean@1")
        == value(got, "rewards/mean@4")
        == pytest.approx(rewards.mean())
    )
    assert value(got, "rewards/best@4") == pytest.approx(np.mean([1.0, 0.5, 0.2]))
    assert value(got, "rewards/zero_variance_group_frac") == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        metrics.group_metrics(rewards[:-1], 4, 0.5)


def test_forking_metrics_report_the_kept_share():
    mask = np.array([[True, True, False], [True, True, True]])
    kept = np.array([[True, False, False], [False, True, False]])
    got = metrics.forking_metrics(kept, mask, 0.7)
    assert value(got, "rollout/forking_kept_token_frac") == pytest.approx(2 / 5)
    assert value(got, "rollout/forking_entropy_threshold") == 0.7
    assert not math.isnan(value(got, "rollout/forking_entropy_threshold"))
