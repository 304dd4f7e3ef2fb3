"""Rollout metrics of one training batch, in tunix's `buffer_metrics` shape.

Owns the names and the arithmetic: `rollout/entropy_mean|p50|p90|p99` over the completion
tokens (padding never counts) and `rollout/trainer_logp_abs_diff_mean|max`, the distance
between the rollout's logprobs and the trainer's recomputation on the same tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jaxtyping import Bool, Float


def rollout_metrics(
    completion_mask: Bool[np.ndarray, "b l"],
    rollout_entropy: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"] | None = None,
    trainer_logprobs: Float[np.ndarray, "b l"] | None = None,
) -> dict[str, tuple[float, Any]]:
    """{name: (value, aggregation over micro-batches)} for `RLCluster.buffer_metrics`."""
    mask = np.asarray(completion_mask, bool)
    entropy = np.asarray(rollout_entropy, np.float64)[mask]
    metrics: dict[str, tuple[float, Any]] = {}
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
