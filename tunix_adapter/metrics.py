"""Metrics of one training batch, in tunix's `buffer_metrics` shape `{name: (value, agg)}`.

Owns the names and the arithmetic (float64, completion tokens only: padding never counts):

- `rollout_metrics`: `rollout/entropy_mean|p50|p90|p99`, and with the trainer's logprobs of the
  same tokens `rollout/trainer_logp_abs_diff_mean|max`;
- `mismatch_metrics`: the rollout-vs-trainer mismatch under the names people already chart:
  tunix main's `sampler_trainer/{logp_diff_mean,logp_diff_max,prob_diff_mean,prob_diff_max,
  probs_pearson_corr}`, verl's `training/rollout_probs_diff_{mean,max,std}` and
  `training/rollout_actor_probs_pearson_corr`, and verl's `rollout_corr/{kl,k3_kl,
  training_ppl,training_log_ppl,rollout_ppl,rollout_log_ppl,log_ppl_diff,log_ppl_abs_diff,
  log_ppl_diff_max,log_ppl_diff_min,ppl_ratio,chi2_token,chi2_seq}`;
- `correction_metrics`: the off-policy ratios before any truncation or rejection, as verl
  computes them (`rollout_corr/rollout_is_*` for a truncation, `rollout_corr/rollout_rs_*`
  for a mask), and what the loss applies under our own names (`off_policy/weight_mean|max|min`,
  `off_policy/rejected_token_frac`); for `token-truncate`, tunix main's
  `sampler_is/{weight_mean,weight_max,frac_clipped_at_threshold}` (its only variant);
- `group_metrics`: `rewards/pass@1`, `rewards/pass@{n}`, `rewards/mean@1`, `rewards/mean@{n}`,
  `rewards/best@{n}` and `rewards/zero_variance_group_frac` over each prompt's n samples;
- `forking_metrics`: `rollout/forking_kept_token_frac` and `rollout/forking_entropy_threshold`;
- `routing_metrics`: `rollout/routing_mismatch_frac` (and per MoE layer), the share of input
  positions whose experts the trainer would choose otherwise than the rollout did.

Formulas follow the originals: verl's `compute_offpolicy_metrics`, `compute_is_metrics`,
`compute_rs_metrics` (verl 518bada21, `verl/trainer/ppo/rollout_corr_helper.py`) and
`calculate_debug_metrics` (population statistics except `rollout_probs_diff_std` and
`rollout_*_seq_std`, which are torch's unbiased `std`), tunix main's
`_sampler_trainer_agreement`; pass@k is the unbiased estimator of Chen et al. (2021).
"""

from __future__ import annotations

from math import comb
from typing import Any

import numpy as np
from jaxtyping import Bool, Float

from tunix_adapter.off_policy import (
    LOG_RATIO_BOUND,
    OffPolicyCorrection,
    ratios,
    rejected,
    row_log_ratios,
)

Metrics = dict[str, tuple[float, Any]]


def rollout_metrics(
    completion_mask: Bool[np.ndarray, "b l"],
    rollout_entropy: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"] | None = None,
    trainer_logprobs: Float[np.ndarray, "b l"] | None = None,
) -> Metrics:
    """Entropy percentiles and the trainer/rollout logprob distance."""
    mask = np.asarray(completion_mask, bool)
    entropy = np.asarray(rollout_entropy, np.float64)[mask]
    metrics: Metrics = {}
    if entropy.size:
        metrics["rollout/entropy_mean"] = (float(entropy.mean()), np.mean)
        for q in (50, 90, 99):
            metrics[f"rollout/entropy_p{q}"] = (float(np.percentile(entropy, q)), np.mean)
    if rollout_logprobs is not None and trainer_logprobs is not None and mask.any():
        diff = np.abs(
            np.asarray(rollout_logprobs, np.float64) - np.asarray(trainer_logprobs, np.float64)
        )[mask]
        metrics["rollout/trainer_logp_abs_diff_mean"] = (float(diff.mean()), np.mean)
        metrics["rollout/trainer_logp_abs_diff_max"] = (float(diff.max()), np.max)
    return metrics


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Population Pearson correlation (0 where either side is constant)."""
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx * dx).mean() * (dy * dy).mean())
    return float((dx * dy).mean() / denominator) if denominator > 0 else 0.0


def routing_metrics(mismatch_frac: Float[np.ndarray, " layers"]) -> Metrics:
    """`rollout/routing_mismatch_frac`: the share of a batch's input positions whose experts
    the trainer, routing itself, chooses otherwise than the rollout did, over all MoE layers
    and per layer (`.../layer_i`); `routing_replay.mismatch_frac` computes the shares."""
    frac = np.asarray(mismatch_frac, np.float64)
    metrics: Metrics = {"rollout/routing_mismatch_frac": (float(frac.mean()), np.mean)}
    for i, value in enumerate(frac):
        metrics[f"rollout/routing_mismatch_frac/layer_{i}"] = (float(value), np.mean)
    return metrics


def mismatch_metrics(
    completion_mask: Bool[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"],
    trainer_logprobs: Float[np.ndarray, "b l"],
) -> Metrics:
    """How far the rollout's logprobs are from the trainer's on the same tokens and weights."""
    mask = np.asarray(completion_mask, bool)
    if not mask.any():
        return {}
    rollout = np.where(mask, np.asarray(rollout_logprobs, np.float64), 0.0)
    trainer = np.where(mask, np.asarray(trainer_logprobs, np.float64), 0.0)
    logp_diff = np.abs(rollout - trainer)[mask]
    p_rollout, p_trainer = np.exp(rollout[mask]), np.exp(trainer[mask])
    prob_diff = np.abs(p_rollout - p_trainer)
    pearson = _pearson(p_rollout, p_trainer)
    metrics: Metrics = {
        "sampler_trainer/logp_diff_mean": (float(logp_diff.mean()), np.mean),
        "sampler_trainer/logp_diff_max": (float(logp_diff.max()), np.max),
        "sampler_trainer/prob_diff_mean": (float(prob_diff.mean()), np.mean),
        "sampler_trainer/prob_diff_max": (float(prob_diff.max()), np.max),
        "sampler_trainer/probs_pearson_corr": (pearson, np.mean),
        "training/rollout_probs_diff_mean": (float(prob_diff.mean()), np.mean),
        "training/rollout_probs_diff_max": (float(prob_diff.max()), np.max),
        "training/rollout_probs_diff_std": (
            float(prob_diff.std(ddof=1)) if prob_diff.size > 1 else 0.0,
            np.mean,
        ),
        "training/rollout_actor_probs_pearson_corr": (pearson, np.mean),
    }
    # verl's rollout_corr off-policy metrics: per-sequence means over sequences with tokens.
    rows = mask.any(-1)
    count = mask.sum(-1)[rows]
    mean_trainer = trainer.sum(-1)[rows] / count
    mean_rollout = rollout.sum(-1)[rows] / count
    log_ratio = trainer - rollout
    log_ppl_diff = mean_rollout - mean_trainer
    seq_log_ratio = np.clip(log_ratio.sum(-1)[rows], -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    token_ratio = np.exp(np.clip(log_ratio[mask], -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    metrics.update(
        {
            "rollout_corr/kl": (float((rollout - trainer)[mask].mean()), np.mean),
            "rollout_corr/k3_kl": (
                float((np.exp(log_ratio[mask]) - log_ratio[mask] - 1).mean()),
                np.mean,
            ),
            "rollout_corr/training_ppl": (float(np.exp(-mean_trainer).mean()), np.mean),
            "rollout_corr/training_log_ppl": (float((-mean_trainer).mean()), np.mean),
            "rollout_corr/rollout_ppl": (float(np.exp(-mean_rollout).mean()), np.mean),
            "rollout_corr/rollout_log_ppl": (float((-mean_rollout).mean()), np.mean),
            "rollout_corr/log_ppl_diff": (float(log_ppl_diff.mean()), np.mean),
            "rollout_corr/log_ppl_abs_diff": (float(np.abs(log_ppl_diff).mean()), np.mean),
            "rollout_corr/log_ppl_diff_max": (float(log_ppl_diff.max()), np.max),
            "rollout_corr/log_ppl_diff_min": (float(log_ppl_diff.min()), np.min),
            "rollout_corr/ppl_ratio": (float(np.exp(log_ppl_diff).mean()), np.mean),
            "rollout_corr/chi2_token": (float((token_ratio**2).mean() - 1.0), np.mean),
            "rollout_corr/chi2_seq": (float(np.exp(2.0 * seq_log_ratio).mean() - 1.0), np.mean),
        }
    )
    return metrics


def correction_metrics(
    completion_mask: Bool[np.ndarray, "b l"],
    loss_mask: Bool[np.ndarray, "b l"],
    weights: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"],
    trainer_logprobs: Float[np.ndarray, "b l"],
    correction: OffPolicyCorrection,
) -> Metrics:
    """The ratios as verl reports them (before truncation, over every completion token) and
    the weights the loss applies (over the loss's mask, `loss_mask`)."""
    mask = np.asarray(completion_mask, bool)
    if not mask.any():
        return {}
    ratio = ratios(trainer_logprobs, rollout_logprobs, mask, correction.level)
    # verl's compute_is_metrics (a truncation; its lower bound is 1 / upper) or
    # compute_rs_metrics (a mask), and the rejection shares of compute_rollout_rejection_mask
    truncate = correction.mode == "truncate"
    metrics = _verl_ratio_metrics(
        "rollout_corr/rollout_is" if truncate else "rollout_corr/rollout_rs",
        ratio,
        mask,
        trainer_logprobs,
        rollout_logprobs,
        correction.level,
        correction.upper,
        1.0 / correction.upper if truncate else correction.lower_bound,
    )
    if not truncate:
        out = rejected(ratio, mask, correction)
        token_share = float(out[mask].mean())
        if correction.level == "token":
            seq_out = out.any(-1)
        else:  # verl reads each row's keep flag (`1 - mask[:, 0]`), rows without tokens too
            log_row = row_log_ratios(trainer_logprobs, rollout_logprobs, mask, correction.level)
            row = np.exp(np.clip(log_row, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))[:, None]
            seq_out = rejected(row, np.ones_like(row, bool), correction)[:, 0]
        metrics["rollout_corr/rollout_rs_masked_fraction"] = (token_share, np.mean)
        metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = (
            float(np.mean(seq_out)),
            np.mean,
        )
        metrics["off_policy/rejected_token_frac"] = (token_share, np.mean)
    applied = np.asarray(weights, np.float64)[np.asarray(loss_mask, bool)]
    if applied.size:
        metrics["off_policy/weight_mean"] = (float(applied.mean()), np.mean)
        metrics["off_policy/weight_max"] = (float(applied.max()), np.max)
        metrics["off_policy/weight_min"] = (float(applied.min()), np.min)
    if correction.name == "token-truncate":  # tunix main's sampler_is, after the clamp
        clipped = np.minimum(ratio, correction.upper)[mask]
        metrics["sampler_is/weight_mean"] = (float(clipped.mean()), np.mean)
        metrics["sampler_is/weight_max"] = (float(clipped.max()), np.max)
        metrics["sampler_is/frac_clipped_at_threshold"] = (
            float((ratio[mask] > correction.upper).mean()),
            np.mean,
        )
    return metrics


def _verl_ratio_metrics(
    prefix: str,
    ratio: np.ndarray,
    mask: np.ndarray,
    trainer_logprobs: np.ndarray,
    rollout_logprobs: np.ndarray,
    level: str,
    upper: float,
    lower: float,
) -> Metrics:
    """verl's statistics of the bounded ratio `w` (`compute_is_metrics` / `compute_rs_metrics`):
    mean over completion tokens; for a per-sequence ratio, max / min / threshold shares over
    every row from the unbounded log ratio; std and ESS of `w` clamped to `[lower, upper]`;
    per-sequence token means and their spread."""
    w = np.where(mask, ratio, 0.0)
    on_mask = w[mask]
    metrics: Metrics = {f"{prefix}_mean": (float(on_mask.mean()), np.mean)}
    if level == "token":
        w_max, w_min = on_mask.max(), on_mask.min()
        high, low = (on_mask > upper).mean(), (on_mask < lower).mean()
    else:
        seq_log = row_log_ratios(trainer_logprobs, rollout_logprobs, mask, level)
        w_max, w_min = np.exp(min(seq_log.max(), LOG_RATIO_BOUND)), np.exp(seq_log.min())
        high = (seq_log > np.log(upper)).mean()
        low = (seq_log < np.log(lower)).mean() if lower > 0 else 0.0
    clamped = np.clip(on_mask, lower, upper)
    std = np.sqrt(max((clamped**2).mean() - clamped.mean() ** 2, 0.0)) if on_mask.size > 1 else 0.0
    ess = 1.0 / ((clamped / (clamped.mean() + 1e-8)) ** 2).mean()
    seq_mean = w.sum(-1) / np.maximum(mask.sum(-1), 1)  # verl's masked_mean: 0 for a bare row
    metrics.update(
        {
            f"{prefix}_max": (float(w_max), np.max),
            f"{prefix}_min": (float(w_min), np.min),
            f"{prefix}_ratio_fraction_high": (float(high), np.mean),
            f"{prefix}_ratio_fraction_low": (float(low), np.mean),
            f"{prefix}_std": (float(std), np.mean),
            f"{prefix}_eff_sample_size": (float(ess), np.mean),
            f"{prefix}_seq_mean": (float(seq_mean.mean()), np.mean),
            f"{prefix}_seq_std": (
                float(seq_mean.std(ddof=1)) if seq_mean.size > 1 else 0.0,
                np.mean,
            ),
            f"{prefix}_seq_max": (float(seq_mean.max()), np.max),
            f"{prefix}_seq_min": (float(seq_mean.min()), np.min),
            f"{prefix}_seq_max_deviation": (float(np.abs(seq_mean - 1.0).max()), np.max),
            f"{prefix}_seq_fraction_high": (float((seq_mean > upper).mean()), np.mean),
            f"{prefix}_seq_fraction_low": (float((seq_mean < lower).mean()), np.mean),
        }
    )
    return metrics


def pass_at_k(successes: int, n: int, k: int) -> float:
    """Unbiased pass@k of a group with `successes` of `n` samples passing (Chen et al. 2021)."""
    if n - successes < k:
        return 1.0
    return 1.0 - comb(n - successes, k) / comb(n, k)


def group_metrics(
    rewards: Float[np.ndarray, " b"], num_generations: int, pass_threshold: float
) -> Metrics:
    """Per-prompt group statistics of one batch (samples of a prompt are adjacent)."""
    values = np.asarray(rewards, np.float64).reshape(-1, num_generations)
    n = num_generations
    passed = (values >= pass_threshold).sum(-1)
    mean = float(values.mean())
    return {
        "rewards/pass@1": (float(np.mean([pass_at_k(c, n, 1) for c in passed])), np.mean),
        f"rewards/pass@{n}": (float(np.mean([pass_at_k(c, n, n) for c in passed])), np.mean),
        # The expected mean reward of k samples is the group mean for every k.
        "rewards/mean@1": (mean, np.mean),
        f"rewards/mean@{n}": (mean, np.mean),
        f"rewards/best@{n}": (float(values.max(-1).mean()), np.mean),
        "rewards/zero_variance_group_frac": (
            float((values.max(-1) == values.min(-1)).mean()),
            np.mean,
        ),
    }


def forking_metrics(
    kept: Bool[np.ndarray, "b l"], completion_mask: Bool[np.ndarray, "b l"], threshold: float
) -> Metrics:
    mask = np.asarray(completion_mask, bool)
    if not mask.any():
        return {}
    return {
        "rollout/forking_kept_token_frac": (float(np.asarray(kept)[mask].mean()), np.mean),
        "rollout/forking_entropy_threshold": (threshold, np.mean),
    }
