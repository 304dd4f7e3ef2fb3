"""Batch metrics against numpy computations written independently from the formulas (verl's,
tunix main's, Chen et al.'s pass@k)."""

import math

import numpy as np
import pytest

from tunix_adapter import metrics
from tunix_adapter.metrics import rollout_metrics
from tunix_adapter.off_policy import OffPolicyCorrection, apply_correction


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


def verl_ratio_metrics(trainer, rollout, mask, level, upper, lower):
    """verl's `compute_is_metrics` / `compute_rs_metrics` (518bada21,
    verl/trainer/ppo/rollout_corr_helper.py lines 196-316 and 438-550), row by row in float64:
    the safety-bounded ratio `w` before truncation; token-weighted mean; per-sequence levels
    take max / min / threshold shares over every row from the unbounded log ratio."""
    rows = []
    for i in range(mask.shape[0]):
        positions = [t for t in range(mask.shape[1]) if mask[i, t]]
        deltas = [float(trainer[i, t]) - float(rollout[i, t]) for t in positions]
        rows.append((positions, deltas))
    tokens, seq_log = [], []
    for _, deltas in rows:
        total = math.fsum(deltas)
        seq_log.append(total / max(len(deltas), 1) if level == "geometric" else total)
        for delta in deltas:
            log_w = delta if level == "token" else seq_log[-1]
            tokens.append(math.exp(min(max(log_w, -20.0), 20.0)))
    w = np.array(tokens)
    out = {"mean": w.mean()}
    if level == "token":
        out.update(max=w.max(), min=w.min(), high=np.mean(w > upper), low=np.mean(w < lower))
    else:
        out.update(
            max=math.exp(min(max(seq_log), 20.0)),
            min=math.exp(min(seq_log)),
            high=np.mean([v > math.log(upper) for v in seq_log]),
            low=np.mean([v < math.log(lower) for v in seq_log]),
        )
    clamped = np.clip(w, lower, upper)
    out["std"] = math.sqrt(max(np.mean(clamped**2) - np.mean(clamped) ** 2, 0.0))
    out["ess"] = 1 / np.mean((clamped / (clamped.mean() + 1e-8)) ** 2)
    seq_mean, start = [], 0
    for positions, _ in rows:
        seq_mean.append(w[start : start + len(positions)].sum() / max(len(positions), 1))
        start += len(positions)
    seq_mean = np.array(seq_mean)
    out.update(
        seq_mean=seq_mean.mean(),
        seq_std=seq_mean.std(ddof=1),
        seq_max_deviation=np.abs(seq_mean - 1).max(),
        seq_fraction_high=np.mean(seq_mean > upper),
    )
    return out


@pytest.mark.parametrize(
    "name", ["token-truncate", "sequence-truncate", "token-mask", "sequence-mask", "geometric-mask"]
)
def test_correction_metrics_are_verls_before_the_clamp(name):
    mask, rollout, trainer = mismatch_batch(1)
    mask[3] = False  # a row without tokens: verl counts it in the per-sequence statistics
    upper = {"token": 1.3, "sequence": 1.2, "geometric": 1.04}[name.split("-")[0]]
    correction = OffPolicyCorrection.parse(name, upper)
    loss_mask, weights = apply_correction(trainer, rollout, mask, correction, ratio_in_loss=False)
    got = metrics.correction_metrics(mask, loss_mask, weights, rollout, trainer, correction)
    prefix = (
        "rollout_corr/rollout_is" if correction.mode == "truncate" else "rollout_corr/rollout_rs"
    )
    want = verl_ratio_metrics(
        trainer, rollout, mask, correction.level, upper, correction.lower_bound
    )
    for key, name_part in [
        ("mean", "mean"),
        ("max", "max"),
        ("min", "min"),
        ("high", "ratio_fraction_high"),
        ("low", "ratio_fraction_low"),
        ("std", "std"),
        ("ess", "eff_sample_size"),
        ("seq_mean", "seq_mean"),
        ("seq_std", "seq_std"),
        ("seq_max_deviation", "seq_max_deviation"),
        ("seq_fraction_high", "seq_fraction_high"),
    ]:
        assert value(got, f"{prefix}_{name_part}") == pytest.approx(want[key], rel=1e-9), key
    other = (
        "rollout_corr/rollout_rs" if correction.mode == "truncate" else "rollout_corr/rollout_is"
    )
    assert not any(k.startswith(other) for k in got)
    assert want["high"] > 0  # the bounds bite in this batch...
    if correction.level == "token":  # ...so verl's max is above the threshold: not clamped
        assert value(got, f"{prefix}_max") > upper
    applied = weights[loss_mask].astype(np.float64)
    assert value(got, "off_policy/weight_mean") == pytest.approx(applied.mean())
    assert value(got, "off_policy/weight_max") == pytest.approx(applied.max())
    assert applied.max() <= upper * (1 + 1e-6)
    if correction.mode == "mask":
        rejected = mask & (weights == 0)
        assert value(got, "rollout_corr/rollout_rs_masked_fraction") == pytest.approx(
            rejected[mask].mean()
        )
        # mask mode's mean is the ratio's, zeros of rejected tokens not averaged in
        assert value(got, f"{prefix}_mean") != pytest.approx(weights[mask].mean())
    assert ("sampler_is/weight_mean" in got) == (name == "token-truncate")
    if name == "token-truncate":  # tunix main's figures, after the clamp
        ratio = np.exp(trainer - rollout)[mask]
        assert value(got, "sampler_is/weight_mean") == pytest.approx(
            np.minimum(ratio, upper).mean()
        )
        assert value(got, "sampler_is/frac_clipped_at_threshold") == pytest.approx(
            np.mean(ratio > upper)
        )


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
