"""Off-policy correction of a rollout batch: importance weights and rejection masks.

Owns `OffPolicyCorrection` (which ratio, truncated or masked, its bounds, where a rejected
token goes; validated) and `apply_correction`, which gives the learner what tunix's GRPO loss
takes: the per-token factors `sampler_is_weights` (the loss multiplies each token's clipped
policy-gradient term by them before aggregation; the KL term never sees them) and the
`completion_mask` the loss aggregates over (its normalisation, the KL term and the entropy).

The ratio is the trainer's probability of each sampled token under the weights that sampled it
over the rollout's, `rho_t = exp(trainer_t - rollout_t)`, on completion tokens only, its log
bounded to +-20 before `exp` (verl's SAFETY_BOUND). Levels:

- `token`: `rho_t` per token (verl `rollout_is: token`, TRL `token_*`);
- `sequence`: `prod_t rho_t` of the sequence, for every token of it (verl `sequence`, TRL
  `sequence_*`, NeMo-RL's sequence-level ratio);
- `geometric`: `exp(mean_t log rho_t)`, the per-token geometric mean (verl's `geometric`
  rejection, SkyRL's geometric-mean sequence mask).

Modes, with the trainer as the old policy (`use_rollout_logprobs=False`, decoupled PPO):

- `truncate`: `min(r, upper)` (TIS; verl `rollout_is`, TRL `*_truncate`);
- `mask`: `r` inside `[lower, upper]`, rejected outside (IcePop; verl `rollout_rs`, TRL
  `*_mask` with a lower bound as well).

Where a rejected token goes (`rejection`, mask only), the two peers differ:

- `zero_weight` (default; TRL `vllm_importance_sampling_mode="*_mask"`, IcePop): its weight is
  0, it stays in the completion mask, so in the loss's denominator, the KL term and the entropy;
- `response_mask` (verl: `compute_rollout_correction_and_add_to_batch` sets
  `batch["response_mask"] = response_mask * rs_mask`): it leaves the completion mask, so the
  loss's normalisation, the KL term and the entropy ignore it; a sequence with no token left
  drops out of a sequence mean.

With the rollout's logprobs as the old policy (`use_rollout_logprobs=True`) tunix's PPO ratio
already is `pi_theta / pi_rollout`, so it already carries `r`: `mask` then only rejects (1
inside the bounds; verl's rejection sampling in bypass mode) and `truncate` is refused (it
would correct twice).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
from jaxtyping import Bool, Float

LEVELS = ("token", "sequence", "geometric")
MODES = ("truncate", "mask")
REJECTIONS = ("zero_weight", "response_mask")
# exp() argument bound (verl's SAFETY_BOUND, tunix's +-20 clip of the log ratio).
LOG_RATIO_BOUND = 20.0


@dataclasses.dataclass(frozen=True)
class OffPolicyCorrection:
    level: Literal["token", "sequence", "geometric"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    upper: float = 2.0
    lower: float | None = None  # mask only; None: 1 / upper (verl's default)
    rejection: Literal["zero_weight", "response_mask"] = "zero_weight"  # mask only

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"is_correction level must be one of {LEVELS}, got {self.level!r}")
        if self.mode not in MODES:
            raise ValueError(f"is_correction mode must be one of {MODES}, got {self.mode!r}")
        if not np.isfinite(self.upper) or self.upper < 1.0:
            raise ValueError(f"is_threshold must be a finite number >= 1.0, got {self.upper}")
        if self.lower is not None:
            if self.mode != "mask":
                raise ValueError(
                    "is_threshold_lower only applies to a mask correction (truncate caps above "
                    f"only), got is_correction={self.name!r}"
                )
            if not 0.0 <= self.lower <= 1.0:
                raise ValueError(f"is_threshold_lower must be in [0, 1], got {self.lower}")
        if self.rejection not in REJECTIONS:
            raise ValueError(f"is_rejection must be one of {REJECTIONS}, got {self.rejection!r}")
        if self.rejection != "zero_weight" and self.mode != "mask":
            raise ValueError(
                f"is_rejection={self.rejection!r} only applies to a mask correction (truncate "
                f"rejects nothing), got is_correction={self.name!r}"
            )

    @classmethod
    def parse(
        cls,
        name: str,
        upper: float = 2.0,
        lower: float | None = None,
        rejection: str = "zero_weight",
    ):
        """From `level-mode` (`sequence-mask`; TRL's `sequence_mask` spelling too)."""
        parts = str(name).replace("_", "-").split("-")
        choices = [f"{level}-{mode}" for level in LEVELS for mode in MODES]
        if len(parts) != 2 or parts[0] not in LEVELS or parts[1] not in MODES:
            raise ValueError(f"is_correction must be one of {choices}, got {name!r}")
        return cls(level=parts[0], mode=parts[1], upper=upper, lower=lower, rejection=rejection)

    @property
    def name(self) -> str:
        return f"{self.level}-{self.mode}"

    @property
    def lower_bound(self) -> float:
        return 1.0 / self.upper if self.lower is None else self.lower


def row_log_ratios(
    trainer_logprobs: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    level: str,
) -> Float[np.ndarray, " b"]:
    """One `log r` per row at a per-sequence level (float64): the sum (`sequence`) or the mean
    (`geometric`) of its completion tokens' log ratios; 0 for a row without tokens."""
    mask = np.asarray(completion_mask, bool)
    delta = np.where(
        mask, np.asarray(trainer_logprobs, np.float64) - np.asarray(rollout_logprobs, np.float64), 0
    )
    if level == "sequence":
        return delta.sum(-1)
    if level == "geometric":
        return delta.sum(-1) / np.maximum(mask.sum(-1), 1)
    raise ValueError(f"level must be 'sequence' or 'geometric' here, got {level!r}")


def log_ratios(
    trainer_logprobs: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    level: str,
) -> Float[np.ndarray, "b l"]:
    """`log r` of each completion token at `level` (float64, 0 off the mask)."""
    mask = np.asarray(completion_mask, bool)
    if level == "token":
        per_token = np.asarray(trainer_logprobs, np.float64) - np.asarray(
            rollout_logprobs, np.float64
        )
    elif level in ("sequence", "geometric"):
        rows = row_log_ratios(trainer_logprobs, rollout_logprobs, mask, level)
        per_token = np.broadcast_to(rows[:, None], mask.shape)
    else:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    return np.where(mask, per_token, 0.0)


def ratios(
    trainer_logprobs: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    level: str,
) -> Float[np.ndarray, "b l"]:
    """`r` of each completion token at `level`, its log bounded to +-20 (float64, 0 off the
    mask): verl's safety-bounded ratio, before any truncation."""
    mask = np.asarray(completion_mask, bool)
    log_r = log_ratios(trainer_logprobs, rollout_logprobs, mask, level)
    return np.where(mask, np.exp(np.clip(log_r, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)), 0.0)


def rejected(
    ratio: Float[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    correction: OffPolicyCorrection,
) -> Bool[np.ndarray, "b l"]:
    """The completion tokens a mask correction rejects (ratio outside `[lower, upper]`, as
    verl compares: `(w >= lower) & (w <= upper)` on the bounded ratio); none for truncate."""
    mask = np.asarray(completion_mask, bool)
    if correction.mode != "mask":
        return np.zeros_like(mask)
    inside = (ratio >= correction.lower_bound) & (ratio <= correction.upper)
    return mask & ~inside


def apply_correction(
    trainer_logprobs: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    correction: OffPolicyCorrection,
    ratio_in_loss: bool,
) -> tuple[Bool[np.ndarray, "b l"], Float[np.ndarray, "b l"]]:
    """(the loss's completion mask, the per-token weights, float32 and 0 off that mask).

    `ratio_in_loss`: the loss's PPO ratio is taken against the rollout's logprobs, so it
    already carries the ratio; a mask then rejects only and a truncation is refused. With
    `rejection="response_mask"` the rejected tokens leave the completion mask.
    """
    mask = np.asarray(completion_mask, bool)
    if correction.mode == "truncate" and ratio_in_loss:
        raise ValueError(
            f"is_correction={correction.name!r} with use_rollout_logprobs=True would correct "
            "twice: the loss's ratio is already taken against the rollout's logprobs. Use "
            "a mask correction, or use_rollout_logprobs=False (the trainer as old policy)"
        )
    ratio = ratios(trainer_logprobs, rollout_logprobs, mask, correction.level)
    out = rejected(ratio, mask, correction)  # none for a truncation
    if correction.mode == "truncate":
        weights = np.minimum(ratio, correction.upper)
    else:
        weights = np.where(out, 0.0, 1.0 if ratio_in_loss else ratio)
    if correction.rejection == "response_mask":
        mask = mask & ~out
    return mask, np.where(mask, weights, 0.0).astype(np.float32)
