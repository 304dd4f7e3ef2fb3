"""`RolloutGRPOConfig`: tunix's `GRPOConfig` plus the settings of `RolloutGRPOLearner`.

Owns the settings' names, defaults and meaning (the class docstring) and their checks at
construction, including the mapping onto tunix main's own rollout-logprob switches. It must
not sample or score: the learner (`learners.py`) reads these settings, the modules the class
docstring names carry them out.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sgl_jax_rollout.tunix_compat import GRPOConfig
from tunix_adapter import egpo, forking, group_sampling
from tunix_adapter.off_policy import OffPolicyCorrection


@dataclasses.dataclass(kw_only=True)
class RolloutGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus: the old policy's source, off-policy correction, forking tokens,
    trainer metrics, group metrics, EGPO.

    - `use_rollout_logprobs`: the rollout's logprobs are the old policy's (else the trainer's,
      under the weights that sampled, at the rollout temperature).
    - `is_correction`: `{token,sequence,geometric}-{truncate,mask}` (`off_policy.py`), with
      `is_threshold` (upper bound, >= 1) and `is_threshold_lower` (mask only; default
      1 / upper). `tis_cap=C` is `is_correction="token-truncate", is_threshold=C`.
    - `is_rejection` (mask corrections): `"zero_weight"` (default; TRL, IcePop: a rejected
      token keeps its place in the loss's denominator and KL term, with weight 0) or
      `"response_mask"` (verl: it leaves the completion mask, so normalisation, KL and
      entropy ignore it).
    - `top_entropy_quantile`: rho in (0, 1]; only the batch's top-rho completion tokens by
      rollout entropy carry policy-gradient loss (the KL term keeps every token).
    - `pass_threshold`: a sample passes (for `rewards/pass@k`) when its reward is >= this.
    - `routing_replay` (default False): the trainer's MoE layers use the experts the rollout
      routed each token to, in the loss and in the trainer's scoring of the old policy
      (verl `router_replay.mode: R3`, slime `--use-rollout-routing-replay`). Needs a tunix
      Qwen3-MoE actor and `EngineSettings(return_routed_experts=True)`.
    - `filter_groups` (DAPO's dynamic sampling; default None, off): keep sampling until the
      batch holds B groups whose rewards are not all equal. `"verl"`: population std > 0
      (verl `algorithm.filter_groups`); `"slime"`: float64 unbiased std > 1e-6 (slime
      `check_reward_nonzero_std`). `filter_groups_metric`: `"reward"` (the summed reward) or
      a reward function's name. `max_num_gen_batches`: the most rounds a batch may take, then
      ValueError (verl's; <= 0: no cap, verl's default).
    - `over_sampling_batch_size` (slime's `--over-sampling-batch-size`; default None): each
      round sends this many prompts (>= B; the batch's own first, then more from the data
      iterator) and returns once the groups it still needs are there, aborting the rest.
      `filter_timing` says what "there" means with a filter: `"slime"` (the default, slime's
      `generate_rollout_async`): each group is scored and filtered as it finishes, and the
      round returns once enough have passed; `"after_stop"`: once enough have finished, then
      they are filtered (fewer reward calls; groups that would have passed are aborted).
    - `mask_offpolicy_in_partial_rollout` (slime's; needs a rollout built with
      `partial_rollout=True`): the tokens a continued sample drew under an older policy
      version leave the loss's completion mask.
    All three sample through `generate_groups` (`group_sampling.py`); so does a rollout with
    partial rollouts on. Training batches only: evaluation samples each batch once.
    """

    use_rollout_logprobs: bool = True
    is_correction: str | None = None
    is_threshold: float = 2.0
    is_threshold_lower: float | None = None
    is_rejection: str = "zero_weight"
    tis_cap: float | None = None
    top_entropy_quantile: float | None = None
    pass_threshold: float = 1.0
    routing_replay: bool = False
    filter_groups: str | None = None
    filter_groups_metric: str = "reward"
    max_num_gen_batches: int = 0
    over_sampling_batch_size: int | None = None
    filter_timing: str = "slime"
    mask_offpolicy_in_partial_rollout: bool = False
    log_trainer_logprobs: bool = True
    egpo_lambda: float = 0.4
    egpo_alpha: float = 2.0
    think_start_id: int | None = None
    think_end_id: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tis_cap is not None:
            if self.is_correction is not None:
                raise ValueError(
                    f"tis_cap={self.tis_cap} is is_correction='token-truncate' with that "
                    f"threshold; set one of them, not both (is_correction={self.is_correction!r})"
                )
            if not np.isfinite(self.tis_cap) or self.tis_cap < 1.0:
                raise ValueError(f"tis_cap must be >= 1.0 (or None), got {self.tis_cap}")
            self.is_correction, self.is_threshold = "token-truncate", self.tis_cap
        correction = self.off_policy_correction()
        if correction is None and self.is_rejection != "zero_weight":
            raise ValueError(
                f"is_rejection={self.is_rejection!r} needs a mask correction (is_correction="
                "'{token,sequence,geometric}-mask'); is_correction is None"
            )
        if correction is not None and correction.mode == "truncate" and self.use_rollout_logprobs:
            raise ValueError(
                f"is_correction={correction.name!r} (or tis_cap) corrects the trainer-vs-rollout "
                "mismatch when the old policy is the trainer's; with use_rollout_logprobs=True "
                "the loss's ratio already carries it. Set use_rollout_logprobs=False, or use a "
                "mask correction (with rollout logprobs it rejects outliers only)"
            )
        forking.check_quantile(self.top_entropy_quantile)
        self._check_group_sampling()
        if not np.isfinite(self.pass_threshold):
            raise ValueError(f"pass_threshold must be finite, got {self.pass_threshold}")
        self.egpo_settings()  # validates lambda, alpha and think ids
        self._map_onto_tunix_main()

    def _check_group_sampling(self) -> None:
        if self.filter_groups is not None and self.filter_groups not in group_sampling.FILTERS:
            raise ValueError(
                f"filter_groups must be one of {group_sampling.FILTERS} or None, got "
                f"{self.filter_groups!r}"
            )
        if self.filter_timing not in group_sampling.FILTER_TIMINGS:
            raise ValueError(
                f"filter_timing must be one of {group_sampling.FILTER_TIMINGS}, got "
                f"{self.filter_timing!r}"
            )
        if not isinstance(self.filter_groups_metric, str) or not self.filter_groups_metric:
            raise ValueError(
                "filter_groups_metric must be 'reward' or a reward function's name, got "
                f"{self.filter_groups_metric!r}"
            )
        if not isinstance(self.max_num_gen_batches, int) or isinstance(
            self.max_num_gen_batches, bool
        ):
            raise ValueError(
                f"max_num_gen_batches must be an integer (<= 0: no cap), got "
                f"{self.max_num_gen_batches!r}"
            )
        size = self.over_sampling_batch_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise ValueError(
                f"over_sampling_batch_size must be an integer >= 1 (prompts per round) or None, "
                f"got {size!r}"
            )

    def samples_groups(self) -> bool:
        """Whether training batches take `group_sampling`'s rounds (or a partial rollout's)."""
        return self.filter_groups is not None or self.over_sampling_batch_size is not None

    def off_policy_correction(self) -> OffPolicyCorrection | None:
        if self.is_correction is None:
            return None
        return OffPolicyCorrection.parse(
            self.is_correction, self.is_threshold, self.is_threshold_lower, self.is_rejection
        )

    def _map_onto_tunix_main(self) -> None:
        """tunix main's GRPO has its own rollout-logprob switches (`use_rollout_logps`, default
        True, and `sampler_is`): set them from ours, so tunix does what we do once and never
        twice (left at its defaults, it would take the rollout logprobs as old logprobs under
        our `use_rollout_logprobs=False`, and its TIS would correct a second time). tunix
        main's `sampler_is="token"` with `sampler_is_threshold=C` is our
        `is_correction="token-truncate", is_threshold=C` (same formula); we compute the
        weights ourselves so both tunix releases train the same way."""
        names = {f.name for f in dataclasses.fields(self)}
        if "sampler_is" in names and self.sampler_is is not None:
            raise ValueError(
                f"RolloutGRPOConfig: sampler_is={self.sampler_is!r} is tunix main's TIS; set "
                "is_correction='token-truncate' and is_threshold (with "
                "use_rollout_logprobs=False) instead"
            )
        if "use_rollout_logps" in names:
            if not self.use_rollout_logps and self.use_rollout_logprobs:
                raise ValueError(
                    "RolloutGRPOConfig: use_rollout_logps=False (tunix main's name) contradicts "
                    "use_rollout_logprobs=True; set use_rollout_logprobs=False"
                )
            self.use_rollout_logps = self.use_rollout_logprobs

    def egpo_settings(self) -> egpo.EgpoSettings:
        return egpo.EgpoSettings(
            egpo_lambda=self.egpo_lambda,
            egpo_alpha=self.egpo_alpha,
            think_start_id=self.think_start_id,
            think_end_id=self.think_end_id,
        )
