"""A learner's training batches in rounds: dynamic sampling, over-sampling, partial rollouts.

Owns `group_sampler` (the `group_sampling.GroupSampler` a `RolloutGRPOLearner` runs for its
training batches, with the checks of the cluster and config it needs, or None where batches
are sampled once), the generate and score calls of a round, and what partial rollouts add to
a batch: each token's `version_lag` and the `partial_rollout/*` metrics. It holds no state:
the sampler keeps the rounds', the learner its data iterator.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from sgl_jax_rollout.rollout_inputs import right_pad_values
from sgl_jax_rollout.tunix_compat import Mode
from tunix_adapter import group_sampling, metrics
from tunix_adapter.grpo_config import RolloutGRPOConfig
from tunix_adapter.rollout_cluster import RolloutCluster

logger = logging.getLogger(__name__)


def group_sampler(
    cluster: RolloutCluster,
    cfg: RolloutGRPOConfig,
    reward_manager: Callable[..., Any],
    draw: Callable[[], Any],
) -> group_sampling.GroupSampler | None:
    """The rounds of dynamic sampling (`group_sampling.py`), None where training batches
    are sampled once (no filter, no over-sampling, no partial rollouts). `draw` gives the
    next micro-batch of the training data (the rounds' extra prompts)."""
    rollout = cluster.rollout
    partial = bool(getattr(rollout, "partial_rollout", False))
    if cfg.mask_offpolicy_in_partial_rollout and not partial:
        raise ValueError(
            "mask_offpolicy_in_partial_rollout=True needs a rollout with partial rollouts "
            "(build_cluster(partial_rollout=True))"
        )
    if not (cfg.samples_groups() or partial):
        return None
    if not hasattr(rollout, "generate_groups"):
        raise ValueError(
            "filter_groups and over_sampling_batch_size need SglangJaxRollout (its "
            f"generate_groups); this cluster's rollout is {type(rollout).__name__}"
        )
    if jax.process_count() > 1:
        raise ValueError(
            "filter_groups, over_sampling_batch_size and partial rollouts run in one JAX "
            f"process for now (this run has {jax.process_count()} processes)"
        )
    if partial and not (
        cfg.use_rollout_logprobs
        or cfg.mask_offpolicy_in_partial_rollout
        or cfg.off_policy_correction() is not None
    ):
        logger.warning(
            "partial rollouts with the trainer as the old policy and neither "
            "mask_offpolicy_in_partial_rollout nor is_correction: tokens of older policy "
            "versions train as if the current policy had sampled them"
        )
    return group_sampling.GroupSampler(
        n=cfg.num_generations,
        filter_rule=cfg.filter_groups,
        metric=cfg.filter_groups_metric,
        max_num_gen_batches=cfg.max_num_gen_batches,
        over_sampling_batch_size=cfg.over_sampling_batch_size,
        filter_timing=cfg.filter_timing,
        generate=functools.partial(_generate_round, cluster, cfg.num_generations),
        score=functools.partial(_score_round, reward_manager),
        draw=draw,
        paused_keys=(lambda: rollout.paused_keys) if partial else None,
    )


def _generate_round(cluster: RolloutCluster, n: int, prompts, keys, groups_needed, accept=None):
    return cluster.generate_groups(
        prompts, mode=Mode.TRAIN, groups_needed=groups_needed, keys=keys, n=n, accept=accept
    )


def _score_round(reward_manager: Callable[..., Any], groups, output):
    """The reward functions on a round's returned rows, as tunix calls them (the metrics
    are buffered for the kept rows only, when tunix asks for the rewards)."""
    fields = group_sampling.join_groups(groups)
    prompts = list(fields.pop("prompts"))
    if "mode" in fields:
        raise ValueError(f"the training input already has a 'mode' field: {sorted(fields)}")
    return reward_manager(prompts=prompts, completions=output.text, mode=str(Mode.TRAIN), **fields)


def version_lag(cluster: RolloutCluster, mask: np.ndarray) -> np.ndarray | None:
    """`[B, max_tokens]`: how many policy versions behind the rollout's current one each
    completion token's sampler was (partial rollouts; 0 off the mask), None without
    versions."""
    versions = getattr(cluster.batch_rollout, "versions", None)
    if versions is None:
        return None
    padded = right_pad_values(versions, mask.shape[1]).astype(np.int64)
    return np.where(mask, cluster.rollout.policy_version - padded, 0)


def partial_metrics(rollout, mask, lag, logprobs, trainer) -> metrics.Metrics:
    """`partial_rollout/*`: the share of completion tokens an older version sampled, the
    oldest lag, the rollout's paused and dropped groups, and the trainer/rollout gap on
    the current version's tokens (the ones the current weights sampled)."""
    stale = lag > 0
    out = {
        "partial_rollout/offpolicy_token_frac": (
            float(stale.sum() / max(mask.sum(), 1)),
            np.mean,
        ),
        "partial_rollout/max_version_lag": (float(lag.max(initial=0)), np.max),
        "partial_rollout/paused_groups": (float(rollout.paused_groups), np.mean),
        "partial_rollout/dropped_stale_groups": (float(rollout.dropped_stale_groups), np.max),
    }
    current = mask & ~stale
    if trainer is not None and logprobs is not None and current.any():
        gap = np.abs(np.asarray(trainer, np.float64) - np.asarray(logprobs, np.float64))
        out["partial_rollout/current_logp_abs_diff_max"] = (float(gap[current].max()), np.max)
    return out
