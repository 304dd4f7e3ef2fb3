"""GRPO and EGPO on rollout logprobs and entropy: tunix's GRPO learner, extended.

Owns `RolloutGRPOConfig` (tunix's `GRPOConfig` plus `use_rollout_logprobs`, `tis_cap`,
`log_trainer_logprobs` and the EGPO settings) and `RolloutGRPOLearner`. The learner runs
tunix's own `_generate_and_compute_advantage` on a `RolloutCluster`, then:

- adds `rollout_logprobs` and `rollout_entropy` `[B, max_tokens_to_generate]` to the training
  example (float32, 0.0 outside the completion mask);
- with `use_rollout_logprobs`, uses the rollout logprobs as the old policy's logprobs (no
  trainer pass for them);
- with `tis_cap`, computes the trainer's logprobs of the sampled tokens under the weights that
  sampled them (tunix's anchor state) and sets tunix's `sampler_is_weights` to
  `min(exp(trainer - rollout), tis_cap)` (truncated importance sampling, as in verl / TRL);
- logs `rollout/entropy_*` and `rollout/trainer_logp_abs_diff_*` (`metrics.py`);
- for `advantage_estimator="egpo"`, hands the think-span entropy of every sample to the
  registered estimator (`egpo.py`) while tunix computes the advantages.
"""

from __future__ import annotations

import contextlib
import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Bool, Float

from sgl_jax_rollout.rollout_inputs import right_pad_ids, right_pad_values
from sgl_jax_rollout.tunix_compat import GRPOConfig, GRPOLearner, Mode, TrainExample
from tunix_adapter import egpo
from tunix_adapter.cluster import RolloutCluster
from tunix_adapter.metrics import rollout_metrics


@flax.struct.dataclass(frozen=True)
class RolloutTrainExample(TrainExample):
    rollout_logprobs: jax.Array | None = None
    rollout_entropy: jax.Array | None = None


@dataclasses.dataclass(kw_only=True)
class RolloutGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus: rollout logprobs as old logprobs, TIS, trainer metrics, EGPO."""

    use_rollout_logprobs: bool = True
    tis_cap: float | None = None
    log_trainer_logprobs: bool = True
    egpo_lambda: float = 0.4
    egpo_alpha: float = 2.0
    think_start_id: int | None = None
    think_end_id: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tis_cap is not None:
            if not np.isfinite(self.tis_cap) or self.tis_cap < 1.0:
                raise ValueError(f"tis_cap must be >= 1.0 (or None), got {self.tis_cap}")
            if self.use_rollout_logprobs:
                raise ValueError(
                    "tis_cap corrects the trainer-vs-rollout mismatch when the old policy is the "
                    "trainer's; with use_rollout_logprobs=True the ratio already corrects it: "
                    "set use_rollout_logprobs=False to use tis_cap"
                )
        self.egpo_settings()  # validates lambda, alpha and think ids
        self._map_onto_tunix_main()

    def _map_onto_tunix_main(self) -> None:
        """tunix main's GRPO has its own rollout-logprob switches (`use_rollout_logps`, default
        True, and `sampler_is`): set them from ours, so tunix does what we do once and never
        twice (left at its defaults, it would take the rollout logprobs as old logprobs under
        our `use_rollout_logprobs=False`, and `tis_cap` would correct a second time). Our TIS is
        tunix main's `sampler_is="token"` with `sampler_is_threshold=tis_cap` (same formula);
        we keep computing it ourselves so both tunix releases train the same way."""
        names = {f.name for f in dataclasses.fields(self)}
        if "sampler_is" in names and self.sampler_is is not None:
            raise ValueError(
                f"RolloutGRPOConfig: sampler_is={self.sampler_is!r} is tunix main's TIS; set "
                "tis_cap (the same truncated weights, with use_rollout_logprobs=False) instead"
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


def tis_weights(
    trainer_logprobs: Float[np.ndarray, "b l"],
    rollout_logprobs: Float[np.ndarray, "b l"],
    completion_mask: Bool[np.ndarray, "b l"],
    cap: float,
) -> Float[np.ndarray, "b l"]:
    """Truncated importance-sampling weights `min(exp(trainer - rollout), cap)`, 0 off-mask."""
    ratio = np.exp(np.clip(trainer_logprobs - rollout_logprobs, -20.0, 20.0))
    return np.where(completion_mask, np.minimum(ratio, cap), 0.0).astype(np.float32)


class RolloutGRPOLearner(GRPOLearner):
    def __init__(self, rl_cluster: RolloutCluster, algo_config: RolloutGRPOConfig, **kwargs):
        if not isinstance(rl_cluster, RolloutCluster):
            raise TypeError(
                "RolloutGRPOLearner needs a tunix_adapter RolloutCluster (build_cluster): tunix's "
                "own cluster drops the rollout entropy"
            )
        if not isinstance(algo_config, RolloutGRPOConfig):
            raise TypeError("algo_config must be a RolloutGRPOConfig")
        super().__init__(rl_cluster=rl_cluster, algo_config=algo_config, **kwargs)

    def _compute_rewards(self, prompts, completions, mode, **kwargs):
        # Called by tunix between generation and the advantage estimator: the moment to hand
        # the estimator what it cannot receive from tunix (the rollout entropy, for EGPO).
        rewards = super()._compute_rewards(prompts, completions, mode, **kwargs)
        if self.algo_config.advantage_estimator == "egpo":
            settings = self.algo_config.egpo_settings()
            ids, mask, _, entropy = self._rollout_arrays(mode)
            h = egpo.think_span_entropy(entropy, ids, mask, settings)
            self._estimator_inputs.enter_context(egpo.estimator_inputs(h, settings))
        return rewards

    def _generate_and_compute_advantage(
        self, training_input, mode: Mode = Mode.TRAIN
    ) -> RolloutTrainExample:
        with contextlib.ExitStack() as self._estimator_inputs:
            example = super()._generate_and_compute_advantage(training_input, mode)
        ids, mask, logprobs, entropy = self._rollout_arrays(mode)
        cfg = self.algo_config
        old = example.old_per_token_logps
        if cfg.use_rollout_logprobs:
            if logprobs is None:
                raise ValueError(
                    "use_rollout_logprobs=True but the rollout returned no logprobs: set "
                    "return_logprobs=True in the RolloutConfig"
                )
            old = jnp.asarray(logprobs)
        trainer = None
        if cfg.tis_cap is not None or (cfg.log_trainer_logprobs and logprobs is not None):
            if not self.should_sync_weights:  # the rollout sampled with the actor's own weights
                self.rl_cluster.snapshot_policy()
            trainer = np.asarray(
                self.rl_cluster.get_actor_per_token_logps(
                    prompt_tokens=example.prompt_ids,
                    completion_tokens=example.completion_ids,
                    pad_id=self.rl_cluster.rollout.pad_id(),
                    eos_id=self.rl_cluster.rollout.eos_id(),
                    micro_batch_size=self._compute_logps_micro_batch_size * cfg.num_generations,
                ),
                np.float32,
            )
        weights = example.sampler_is_weights
        if cfg.tis_cap is not None:
            if logprobs is None:
                raise ValueError("tis_cap needs rollout logprobs: set return_logprobs=True")
            weights = jnp.asarray(tis_weights(trainer, logprobs, mask, cfg.tis_cap))
        self.rl_cluster.buffer_metrics(rollout_metrics(mask, entropy, logprobs, trainer), mode=mode)
        fields = {f.name: getattr(example, f.name) for f in dataclasses.fields(example)}
        fields.update(
            old_per_token_logps=old,
            sampler_is_weights=weights,
            rollout_logprobs=None if logprobs is None else jnp.asarray(logprobs),
            rollout_entropy=jnp.asarray(entropy),
        )
        return RolloutTrainExample(**fields)

    def _rollout_arrays(self, mode: Mode):
        """(completion ids, mask, logprobs or None, entropy) `[B, max_tokens]` of the last
        rollout, right-padded (pad id / False / 0.0) the way tunix pads the completions."""
        out = self.rl_cluster.last_rollout
        if out is None or out.entropy is None:
            raise ValueError(
                "the rollout returned no entropy: use SglangJaxRollout (return_entropy=True) or "
                "VanillaRolloutWithEntropy"
            )
        width = self.rl_cluster.get_rollout_config(mode).max_tokens_to_generate
        pad = self.rl_cluster.rollout.pad_id()
        ids = right_pad_ids(out.tokens, width, pad)
        mask = ids != pad  # tunix's completion mask
        entropy = right_pad_values(out.entropy, width) * mask
        logprobs = None if out.logprobs is None else right_pad_values(out.logprobs, width) * mask
        return ids, mask, logprobs, entropy
