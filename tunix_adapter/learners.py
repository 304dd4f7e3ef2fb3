"""GRPO and EGPO on rollout logprobs and entropy: tunix's GRPO learner, extended.

Owns `RolloutGRPOConfig` (tunix's `GRPOConfig` plus the settings below) and
`RolloutGRPOLearner`. The learner runs tunix's own `_generate_and_compute_advantage` on a
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
  (`routing_replay.py`, verl's R3);
- for `advantage_estimator="egpo"`, hands the think-span entropy of every sample to the
  registered estimator (`egpo.py`) while tunix computes the advantages;
- with `filter_groups`, `over_sampling_batch_size` or a rollout with partial rollouts, fills a
  training batch in rounds (`group_sampling.py`: DAPO's filter, over-sampling with early
  stop, paused groups continued), then lets tunix build the example from the kept rows
  (`RolloutCluster.answering_generate`, the rounds' rewards as `_compute_rewards`' answer);
  `mask_offpolicy_in_partial_rollout` takes older policy versions' tokens out of the mask.

Everything of one batch (the rollout's result, the trainer's scores, the estimator's inputs,
the old-policy answer) is kept per thread: tunix produces training batches on its data thread
while its main thread produces evaluation batches, at once where the rollout has devices of
its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading

import flax
import jax
import jax.numpy as jnp
import numpy as np

from sgl_jax_rollout.rollout_inputs import right_pad_ids, right_pad_values
from sgl_jax_rollout.tunix_compat import GRPOConfig, GRPOLearner, Mode, TrainExample
from tunix_adapter import egpo, forking, group_sampling, metrics, routing_replay
from tunix_adapter.cluster import RolloutCluster
from tunix_adapter.off_policy import OffPolicyCorrection, apply_correction

logger = logging.getLogger(__name__)


@flax.struct.dataclass(frozen=True)
class RolloutTrainExample(TrainExample):
    rollout_logprobs: jax.Array | None = None
    rollout_entropy: jax.Array | None = None
    routed_experts: jax.Array | None = None  # [B, prompt + max_tokens, layers, top_k]


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
            self._replay_in_loss()
        self._train_iterator = None  # tunix's, for the rounds' extra prompts
        self._sampler = self._group_sampler()

    def _group_sampler(self) -> group_sampling.GroupSampler | None:
        """The rounds of dynamic sampling (`group_sampling.py`), None where training batches
        are sampled once (no filter, no over-sampling, no partial rollouts)."""
        cfg, rollout = self.algo_config, self.rl_cluster.rollout
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
            generate=self._generate_round,
            score=self._score_round,
            draw=self._draw_micro_batch,
            paused_keys=(lambda: rollout.paused_keys) if partial else None,
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

    def _generate_round(self, prompts, keys, groups_needed, accept=None):
        return self.rl_cluster.generate_groups(
            prompts,
            mode=Mode.TRAIN,
            groups_needed=groups_needed,
            keys=keys,
            n=self.algo_config.num_generations,
            accept=accept,
        )

    def _score_round(self, groups, output):
        """The reward functions on a round's returned rows, as tunix calls them (the metrics
        are buffered for the kept rows only, when tunix asks for the rewards)."""
        fields = group_sampling.join_groups(groups)
        prompts = list(fields.pop("prompts"))
        if "mode" in fields:
            raise ValueError(f"the training input already has a 'mode' field: {sorted(fields)}")
        return self.reward_manager(
            prompts=prompts, completions=output.text, mode=str(Mode.TRAIN), **fields
        )

    def _replay_in_loss(self) -> None:
        """Wraps tunix's loss (set by `GRPOLearner.__init__`) so that its forward routes with
        the example's `routed_experts` (`routing_replay.replaying`, inside the trace)."""
        if jax.process_count() > 1:
            raise ValueError(
                "routing_replay runs in one JAX process: its trainer scoring does not yet gather "
                f"every host's rows (this run has {jax.process_count()} processes)"
            )
        trainer = self.rl_cluster.actor_trainer
        routing_replay.enable(trainer.model)
        loss_fn = trainer.loss_fn

        @functools.wraps(loss_fn)  # nnx.grad maps tunix's keyword inputs by its signature
        def replayed_loss(model, train_example, *args, **kwargs):
            with routing_replay.replaying(model, train_example.routed_experts):
                return loss_fn(model, train_example, *args, **kwargs)

        trainer.with_loss_fn(replayed_loss, has_aux=True)

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
            batch_metrics.update(self._routing_metrics(example.prompt_ids, ids))
        if correction is not None:
            loss_mask, weights = apply_correction(
                trainer, logprobs, mask, correction, ratio_in_loss=cfg.use_rollout_logprobs
            )
            batch_metrics.update(
                metrics.correction_metrics(mask, loss_mask, weights, logprobs, trainer, correction)
            )
        lag = self._version_lag(mask)
        if lag is not None:
            stale = lag > 0
            batch_metrics.update(self._partial_metrics(mask, lag, logprobs, trainer))
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

    def _version_lag(self, mask: np.ndarray) -> np.ndarray | None:
        """`[B, max_tokens]`: how many policy versions behind the rollout's current one each
        completion token's sampler was (partial rollouts; 0 off the mask), None without
        versions."""
        versions = getattr(self.rl_cluster.batch_rollout, "versions", None)
        if versions is None:
            return None
        padded = right_pad_values(versions, mask.shape[1]).astype(np.int64)
        return np.where(mask, self.rl_cluster.rollout.policy_version - padded, 0)

    def _partial_metrics(self, mask, lag, logprobs, trainer) -> metrics.Metrics:
        """`partial_rollout/*`: the share of completion tokens an older version sampled, the
        oldest lag, the rollout's paused and dropped groups, and the trainer/rollout gap on
        the current version's tokens (the ones the current weights sampled)."""
        rollout = self.rl_cluster.rollout
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

    def _batch_routing(self, prompt_width: int, width: int) -> np.ndarray | None:
        """This batch's routing (`_rollout_routing`), read once per batch: the old policy's
        scoring may need it inside tunix's `_generate_and_compute_advantage`."""
        if self._batch.routing is None:
            self._batch.routing = self._rollout_routing(prompt_width, width)
        return self._batch.routing

    def _replayed_actor_logps(self, prompt_tokens, completion_tokens, *args, **kwargs):
        """tunix main's `get_actor_per_token_logps` under routing replay: the trainer's
        logprobs with this batch's rollout experts (`_trainer_scores`), so the first
        iteration's ratio is 1 where the trainer alone would route otherwise."""
        del args, kwargs  # pad / eos / micro-batch / temperature: the learner's own
        return jnp.asarray(self._trainer_scores(prompt_tokens, completion_tokens))

    def _rollout_routing(self, prompt_width: int, width: int) -> np.ndarray | None:
        """The last rollout's routed experts in the trainer's input layout, None where the
        rollout returned none (a dense model); ValueError under `routing_replay` then."""
        out = self.rl_cluster.batch_rollout
        if getattr(out, "routed_experts", None) is None and not self.algo_config.routing_replay:
            return None
        return routing_replay.input_routing(out, prompt_width, width)  # raises without them

    def _routing_metrics(self, prompt_ids, completion_ids) -> metrics.Metrics:
        """`rollout/routing_mismatch_frac` (overall and per layer): the share of the batch's
        input positions whose experts the trainer, routing itself, would choose otherwise."""
        _, used = routing_replay.routing_and_logps(
            self.rl_cluster.actor_trainer.model,
            jnp.asarray(prompt_ids),
            jnp.asarray(completion_ids),
            None,
            pad_id=self.rl_cluster.rollout.pad_id(),
            eos_id=self.rl_cluster.rollout.eos_id(),
            temperature=self.algo_config.temperature,
        )
        routing = self._batch.routing
        frac = routing_replay.mismatch_frac(routing, np.asarray(used), routing[..., 0, 0] >= 0)
        return metrics.routing_metrics(frac)

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
        """The trainer's logprobs of the sampled tokens routed as the rollout routed them,
        under the weights that sampled them (the anchor state, as tunix scores)."""
        if not self.should_sync_weights:
            self.rl_cluster.snapshot_policy()
        routing = self._batch_routing(prompt_ids.shape[1], completion_ids.shape[1])
        logps, _ = routing_replay.routing_and_logps(
            self.rl_cluster.anchor_model(),
            jnp.asarray(prompt_ids),
            jnp.asarray(completion_ids),
            jnp.asarray(routing),
            pad_id=self.rl_cluster.rollout.pad_id(),
            eos_id=self.rl_cluster.rollout.eos_id(),
            temperature=self.algo_config.temperature,
        )
        return np.asarray(logps, np.float32)

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
