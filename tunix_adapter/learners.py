"""GRPO and EGPO on rollout logprobs and entropy: tunix's GRPO learner, extended.

Owns `RolloutGRPOLearner` and the `RolloutTrainExample` it builds; its settings are
`RolloutGRPOConfig` (`grpo_config.py`: tunix's `GRPOConfig` plus the settings below, importable
from here as before). The learner runs tunix's own `_generate_and_compute_advantage` on a
`RolloutCluster`, then:

- adds `rollout_logprobs` and `rollout_entropy` `[B, max_tokens_to_generate]` to the training
  example (float32, 0.0 outside the completion mask);
- takes the old policy's logprobs from the rollout (`use_rollout_logprobs=True`, no trainer
  pass) or from the trainer under the weights that sampled, at the rollout temperature
  (`use_rollout_logprobs=False`). tunix 0.1.7 would score them with `rollout.
  get_per_token_logps`, at temperature 1 while its loss tempers: the learner answers that call
  itself (`_old_policy_answer`), so every path matches the loss's logprobs;
- with `is_correction` (or its shorthand `tis_cap`), sets tunix's `sampler_is_weights` from
  the trainer-vs-rollout ratio, and with `is_rejection="response_mask"` takes the rejected
  tokens out of the example's `completion_mask` (`off_policy.py`); with
  `top_entropy_quantile`, zeroes the weights outside the highest-entropy tokens of the global
  batch (`forking.py`);
- logs the rollout entropy, the trainer/rollout mismatch (for a MoE whose rollout returns its
  routing, also `rollout/routing_mismatch_frac`: per layer and overall, the share of positions
  whose experts the trainer would choose otherwise), the correction's ratios and weights,
  the forking share and the per-prompt group metrics (`metrics.py`);
- with `routing_replay` (a Qwen3-MoE actor, the engine serving `return_routed_experts`), adds
  the rollout's routed experts `[B, prompt + max_tokens, layers, top_k]` to the example; the
  loss's forward and the trainer's scoring of the sampled tokens route every token to them
  (`routing_replay.py`, verl's R3; the learner's side in `learner_replay.py`);
- for `advantage_estimator="egpo"`, hands the think-span entropy of every sample to the
  registered estimator (`egpo.py`) while tunix computes the advantages;
- with `filter_groups`, `over_sampling_batch_size` or a rollout with partial rollouts, fills a
  training batch in rounds (`group_sampling.py`: DAPO's filter, over-sampling with early
  stop, paused groups continued; the learner's side in `learner_rounds.py`), then lets tunix
  build the example from the kept rows (`RolloutCluster.answering_generate`, the rounds'
  rewards as `_compute_rewards`' answer);
  `mask_offpolicy_in_partial_rollout` takes older policy versions' tokens out of the mask.

Everything of one batch (the rollout's result, the trainer's scores, the estimator's inputs,
the old-policy answer) is kept per thread: tunix produces training batches on its data thread
while its main thread produces evaluation batches, at once where the rollout has devices of
its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import flax
import jax
import jax.numpy as jnp
import numpy as np

from sgl_jax_rollout.rollout_inputs import right_pad_ids, right_pad_values
from sgl_jax_rollout.tunix_compat import GRPOLearner, Mode, TrainExample
from tunix_adapter import egpo, forking, group_sampling, learner_replay, learner_rounds, metrics
from tunix_adapter.grpo_config import RolloutGRPOConfig
from tunix_adapter.off_policy import apply_correction
from tunix_adapter.rollout_cluster import RolloutCluster


@flax.struct.dataclass(frozen=True)
class RolloutTrainExample(TrainExample):
    rollout_logprobs: jax.Array | None = None
    rollout_entropy: jax.Array | None = None
    routed_experts: jax.Array | None = None  # [B, prompt + max_tokens, layers, top_k]


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
        self._batch = threading.local()  # trainer_logps, estimator_inputs: this thread's batch
        if algo_config.routing_replay:
            learner_replay.replay_in_loss(rl_cluster.actor_trainer)
        self._train_iterator = None  # tunix's, for the rounds' extra prompts
        self._sampler = learner_rounds.group_sampler(
            rl_cluster, algo_config, self.reward_manager, self._draw_micro_batch
        )

    def _prepare_data(self, *args, **kwargs):
        # tunix hands its data iterator to this call (keyword, both releases); the rounds of
        # dynamic sampling draw their extra prompts from the training one.
        if kwargs.get("mode", Mode.TRAIN) == Mode.TRAIN:
            self._train_iterator = kwargs["iterator"] if "iterator" in kwargs else args[0]
        return super()._prepare_data(*args, **kwargs)

    def _draw_micro_batch(self):
        if self._train_iterator is None:
            raise StopIteration
        return next(self._train_iterator)

    def _compute_rewards(self, prompts, completions, mode, **kwargs):
        # Called by tunix between generation and the advantage estimator: the moment to hand
        # the estimator what it cannot receive from tunix (the rollout entropy, for EGPO).
        kept = getattr(self._batch, "rewards", None)
        if kept is not None:  # dynamic sampling scored these rows already: no second call
            self._batch.rewards = None
            self.rl_cluster.buffer_metrics(kept["log_metrics"], mode=mode)
            rewards = kept["rewards"]
        else:
            rewards = super()._compute_rewards(prompts, completions, mode, **kwargs)
        cfg = self.algo_config
        self.rl_cluster.buffer_metrics(
            metrics.group_metrics(rewards, cfg.num_generations, cfg.pass_threshold), mode=mode
        )
        if cfg.advantage_estimator == "egpo":
            settings = cfg.egpo_settings()
            ids, mask, _, entropy = self._rollout_arrays(mode)
            h = egpo.think_span_entropy(entropy, ids, mask, settings)
            self._batch.estimator_inputs.enter_context(egpo.estimator_inputs(h, settings))
        return rewards

    def _generate_and_compute_advantage(
        self, training_input, mode: Mode = Mode.TRAIN
    ) -> RolloutTrainExample:
        cfg = self.algo_config
        self._batch.trainer_logps = self._batch.rewards = self._batch.routing = None
        with contextlib.ExitStack() as self._batch.estimator_inputs:
            self._batch.estimator_inputs.enter_context(
                self.rl_cluster.answering_old_policy(self._old_policy_answer(mode))
            )
            if cfg.routing_replay:  # tunix main's old policy (num_iterations > 1), replayed
                self._batch.estimator_inputs.enter_context(
                    self.rl_cluster.answering_actor_logps(self._replayed_actor_logps)
                )
            if mode == Mode.TRAIN and self._sampler is not None:
                collected = self._sampler.collect(self._sampler.split(training_input))
                training_input = group_sampling.join_groups(collected.groups)
                self._batch.rewards = collected.rewards
                self._batch.estimator_inputs.enter_context(
                    self.rl_cluster.answering_generate(collected.output)
                )
                self.rl_cluster.buffer_metrics(collected.stats.metrics(), mode=mode)
            example = super()._generate_and_compute_advantage(training_input, mode)
        ids, mask, logprobs, entropy = self._rollout_arrays(mode)
        self._batch_routing(example.prompt_ids.shape[1], ids.shape[1])
        correction = cfg.off_policy_correction()
        if (cfg.use_rollout_logprobs or correction is not None) and logprobs is None:
            raise ValueError(
                "use_rollout_logprobs=True and is_correction need the rollout's logprobs: set "
                "return_logprobs=True in the RolloutConfig"
            )
        old = example.old_per_token_logps
        if cfg.use_rollout_logprobs:
            old = jnp.asarray(logprobs)
        elif old is not None and self._batch.trainer_logps is None:
            # tunix main scored the old policy with the trainer itself (use_rollout_logps=False)
            self._batch.trainer_logps = np.asarray(old, np.float32)
        trainer = None
        if correction is not None or (cfg.log_trainer_logprobs and logprobs is not None):
            trainer = self._trainer_scores(example.prompt_ids, example.completion_ids)
        weights = example.sampler_is_weights
        loss_mask = mask
        batch_metrics = metrics.rollout_metrics(mask, entropy, logprobs, trainer)
        if trainer is not None and logprobs is not None:
            batch_metrics.update(metrics.mismatch_metrics(mask, logprobs, trainer))
        if self._batch.routing is not None:
            batch_metrics.update(
                learner_replay.routing_metrics(
                    self.rl_cluster, self._batch.routing, example.prompt_ids, ids, cfg.temperature
                )
            )
        if correction is not None:
            loss_mask, weights = apply_correction(
                trainer, logprobs, mask, correction, ratio_in_loss=cfg.use_rollout_logprobs
            )
            batch_metrics.update(
                metrics.correction_metrics(mask, loss_mask, weights, logprobs, trainer, correction)
            )
        lag = learner_rounds.version_lag(self.rl_cluster, mask)
        if lag is not None:
            stale = lag > 0
            batch_metrics.update(
                learner_rounds.partial_metrics(
                    self.rl_cluster.rollout, mask, lag, logprobs, trainer
                )
            )
            if cfg.mask_offpolicy_in_partial_rollout:
                loss_mask = np.asarray(loss_mask, bool) & ~stale
        if cfg.top_entropy_quantile is not None:
            kept, threshold = forking.top_entropy_mask(entropy, mask, cfg.top_entropy_quantile)
            base = loss_mask.astype(np.float32) if weights is None else np.asarray(weights)
            weights = np.where(kept, base, 0.0).astype(np.float32)
            batch_metrics.update(metrics.forking_metrics(kept, mask, threshold))
        self.rl_cluster.buffer_metrics(batch_metrics, mode=mode)
        fields = {f.name: getattr(example, f.name) for f in dataclasses.fields(example)}
        if loss_mask is not mask:
            completion_mask = example.completion_mask
            fields["completion_mask"] = jnp.asarray(loss_mask, completion_mask.dtype)
        fields.update(
            old_per_token_logps=old,
            sampler_is_weights=None if weights is None else jnp.asarray(weights),
            rollout_logprobs=None if logprobs is None else jnp.asarray(logprobs),
            rollout_entropy=jnp.asarray(entropy),
            routed_experts=(jnp.asarray(self._batch.routing) if cfg.routing_replay else None),
        )
        return RolloutTrainExample(**fields)

    def _batch_routing(self, prompt_width: int, width: int) -> np.ndarray | None:
        """This batch's routing (`learner_replay.rollout_routing`), read once per batch: the old
        policy's scoring may need it inside tunix's `_generate_and_compute_advantage`."""
        if self._batch.routing is None:
            self._batch.routing = learner_replay.rollout_routing(
                self.rl_cluster, self.algo_config.routing_replay, prompt_width, width
            )
        return self._batch.routing

    def _replayed_actor_logps(self, prompt_tokens, completion_tokens, *args, **kwargs):
        """tunix main's `get_actor_per_token_logps` under routing replay: the trainer's
        logprobs with this batch's rollout experts (`_trainer_scores`), so the first
        iteration's ratio is 1 where the trainer alone would route otherwise."""
        del args, kwargs  # pad / eos / micro-batch / temperature: the learner's own
        return jnp.asarray(self._trainer_scores(prompt_tokens, completion_tokens))

    def _old_policy_answer(self, mode: Mode):
        """tunix 0.1.7 scores the old policy (`num_iterations > 1`) with the rollout engine at
        temperature 1 (`RLCluster.get_old_per_token_logps`), while its loss tempers by the
        rollout temperature: answer that call with the old policy's logprobs as the loss sees
        them (the rollout's, or the trainer's under the sampling weights at that
        temperature), so the first iteration's ratio is 1."""

        def old_policy_logps(prompt_tokens, completion_tokens, micro_batch_size=None):
            del micro_batch_size
            if self.algo_config.use_rollout_logprobs:
                logprobs = self._rollout_arrays(mode)[2]
                if logprobs is not None:
                    return jnp.asarray(logprobs)
            return jnp.asarray(self._trainer_scores(prompt_tokens, completion_tokens))

        return old_policy_logps

    def _trainer_scores(self, prompt_ids, completion_ids) -> np.ndarray:
        """The trainer's logprobs `[B, max_tokens]` of the sampled tokens under the weights that
        sampled them (tunix's anchor state), at the rollout temperature; once per batch."""
        if self._batch.trainer_logps is None and self.algo_config.routing_replay:
            self._batch.trainer_logps = self._replayed_scores(prompt_ids, completion_ids)
        if self._batch.trainer_logps is None:
            if not self.should_sync_weights:  # the rollout sampled with the actor's own weights
                self.rl_cluster.snapshot_policy()
            self._batch.trainer_logps = np.asarray(
                self.rl_cluster.get_actor_per_token_logps(
                    prompt_tokens=prompt_ids,
                    completion_tokens=completion_ids,
                    pad_id=self.rl_cluster.rollout.pad_id(),
                    eos_id=self.rl_cluster.rollout.eos_id(),
                    micro_batch_size=(
                        self._compute_logps_micro_batch_size * self.algo_config.num_generations
                    ),
                    temperature=self.algo_config.temperature,
                ),
                np.float32,
            )
        return self._batch.trainer_logps

    def _replayed_scores(self, prompt_ids, completion_ids) -> np.ndarray:
        """`learner_replay.replayed_scores` of this batch, under the weights that sampled it."""
        if not self.should_sync_weights:
            self.rl_cluster.snapshot_policy()
        routing = self._batch_routing(prompt_ids.shape[1], completion_ids.shape[1])
        return learner_replay.replayed_scores(
            self.rl_cluster, routing, prompt_ids, completion_ids, self.algo_config.temperature
        )

    def _rollout_arrays(self, mode: Mode):
        """(completion ids, mask, logprobs or None, entropy) `[B, max_tokens]` of the last
        rollout, right-padded (pad id / False / 0.0) the way tunix pads the completions."""
        out = self.rl_cluster.batch_rollout
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
