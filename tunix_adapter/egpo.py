"""EGPO: the entropy-guided GRPO advantage (docs/design.md section 5), registered with tunix.

Owns the formula and its inputs: `EgpoSettings` (lambda, alpha, think ids; validated),
`think_span_entropy` (mean rollout entropy over the tokens strictly between think-start and
think-end, or over the whole completion when a sample has no such span; padding ignored)
and `egpo_advantages`:

    A_egpo_i = A_i + lambda * clip(H_i, -|A_i| / alpha, |A_i| / alpha)

with `A_i` tunix's own group-normalised GRPO advantage. The estimator is registered with
tunix's function registry as `egpo`; tunix's learners call estimators with `rewards` and
`num_generations` only, so `RolloutGRPOLearner` hands the entropy over with
`estimator_inputs` for the duration of that call.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import numpy as np
from jaxtyping import Bool, Float, Int

from sgl_jax_rollout.tunix_compat import (
    algo_core,  # noqa: F401  (registers tunix's own "grpo" estimator)
    get_advantage_estimator,
    register_advantage_estimator,
)

QWEN3_THINK_IDS = (151667, 151668)


@dataclasses.dataclass(frozen=True)
class EgpoSettings:
    egpo_lambda: float = 0.4
    egpo_alpha: float = 2.0
    think_start_id: int | None = None
    think_end_id: int | None = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.egpo_lambda) or self.egpo_lambda < 0:
            raise ValueError(f"egpo_lambda must be >= 0, got {self.egpo_lambda}")
        if not np.isfinite(self.egpo_alpha) or self.egpo_alpha <= 1:
            raise ValueError(
                f"egpo_alpha must be > 1 (so the entropy term never flips an advantage's "
                f"sign), got {self.egpo_alpha}"
            )
        if self.egpo_lambda >= self.egpo_alpha:
            raise ValueError(
                f"egpo_lambda must be < egpo_alpha (the entropy term is at most "
                f"lambda / alpha * |A|, so only then can it never flip the sign of A), got "
                f"lambda={self.egpo_lambda}, alpha={self.egpo_alpha}"
            )
        if (self.think_start_id is None) != (self.think_end_id is None):
            raise ValueError("think_start_id and think_end_id must be given together")


def think_span_mask(
    completion_ids: Int[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    think_start_id: int | None,
    think_end_id: int | None,
) -> Bool[np.ndarray, "b l"]:
    """Tokens strictly between the first think-start and the next think-end of each row;
    the whole (unpadded) completion for rows without such a span."""
    ids = np.asarray(completion_ids)
    valid = np.asarray(completion_mask, bool)
    span = np.zeros_like(valid)
    for i in range(ids.shape[0]):
        row = np.flatnonzero(valid[i])
        tokens = ids[i, row]
        starts = np.flatnonzero(tokens == think_start_id) if think_start_id is not None else []
        found = False
        if len(starts):
            ends = np.flatnonzero(tokens[starts[0] + 1 :] == think_end_id)
            if len(ends):
                span[i, row[starts[0] + 1 : starts[0] + 1 + ends[0]]] = True
                found = True
        if not found:
            span[i, row] = True
    return span


def think_span_entropy(
    entropy: Float[np.ndarray, "b l"],
    completion_ids: Int[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    settings: EgpoSettings,
) -> Float[np.ndarray, " b"]:
    """`H_i`: mean rollout entropy over each row's think span (0 for an empty span)."""
    span = think_span_mask(
        completion_ids, completion_mask, settings.think_start_id, settings.think_end_id
    )
    values = np.where(span, np.asarray(entropy, np.float64), 0.0)
    count = span.sum(-1)
    return np.where(count > 0, values.sum(-1) / np.maximum(count, 1), 0.0)


def egpo_advantages(
    rewards: Float[np.ndarray, " b"],
    num_generations: int,
    entropy_mean: Float[np.ndarray, " b"],
    settings: EgpoSettings,
) -> Float[np.ndarray, " b"]:
    """The EGPO advantage of each sample, from tunix's GRPO advantage and `H_i`."""
    rewards = np.asarray(rewards)
    entropy_mean = np.asarray(entropy_mean, np.float64)
    if entropy_mean.shape != rewards.shape:
        raise ValueError(
            f"entropy_mean must have one value per sample {rewards.shape}, got {entropy_mean.shape}"
        )
    grpo = get_advantage_estimator("grpo")
    advantage = np.asarray(grpo(rewards=rewards, num_generations=num_generations), np.float64)
    bound = np.abs(advantage) / settings.egpo_alpha
    return advantage + settings.egpo_lambda * np.clip(entropy_mean, -bound, bound)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    entropy_mean: np.ndarray
    settings: EgpoSettings


_INPUTS: contextvars.ContextVar[_Inputs | None] = contextvars.ContextVar("egpo", default=None)


@contextlib.contextmanager
def estimator_inputs(entropy_mean: np.ndarray, settings: EgpoSettings) -> Iterator[None]:
    """Makes `H_i` and the settings available to the registered `egpo` estimator."""
    token = _INPUTS.set(_Inputs(np.asarray(entropy_mean), settings))
    try:
        yield
    finally:
        _INPUTS.reset(token)


@register_advantage_estimator("egpo")
def compute_egpo_advantages(rewards: np.ndarray, num_generations: int) -> np.ndarray:
    """tunix advantage estimator `egpo` (called by tunix with rewards and group size only)."""
    inputs = _INPUTS.get()
    if inputs is None:
        raise ValueError(
            "advantage_estimator 'egpo' needs the rollout entropy: train with "
            "tunix_adapter.RolloutGRPOLearner (tunix's own learners do not pass it)"
        )
    return egpo_advantages(rewards, num_generations, inputs.entropy_mean, inputs.settings)
