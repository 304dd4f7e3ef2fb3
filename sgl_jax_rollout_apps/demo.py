"""The main job: `sgl-jax-rollout demo`: GRPO / EGPO / PPO on the built-in model, on CPU.

Owns the toy task (prompts, `rewards.vowel_word_reward`), the real-task runs (`--task NAME`:
a task of `tasks.TASKS` on a real checkpoint, by default SmolLM2-135M-Instruct from
`real_model`, with held-out evaluation and step timing from `task_run`; `--rollout both`
runs it with each rollout on the same seeds), the training configuration of each algorithm,
the per-step report (tqdm bar; reward mean, completion length, rollout entropy mean,
trainer/rollout logprob difference) and the outputs in `--out DIR`:
`metrics.jsonl` (one line per step: every metric the learner and tunix log that step, under
its own name, and the short names of `REPORTED`) and `metrics.png` (reward, rollout entropy
and the trainer/rollout logprob mismatch over steps).
Every number comes from tunix's metrics buffer, through the cluster's external logger.

With one process per host (`sgl-jax-rollout launch ... -- demo --preset cpu-2host`), every
process samples its share of each step's prompts (`local_prompts`) and reports the metrics of
that share, in `--out/process-<i>/`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import tpu_configs
from sgl_jax_rollout.utils.compiles import count_compiles
from sgl_jax_rollout_apps.plotting import require_matplotlib, training_curves

log = logging.getLogger(__name__)
ALGOS = ("grpo", "egpo", "ppo")
ROLLOUTS = ("sglang_jax", "vanilla", "both")
REPORTED = {
    "reward_mean": "rewards/score/mean",
    "completion_length": "completions/mean_length",
    "entropy_mean": "rollout/entropy_mean",
    "logp_diff_mean": "rollout/trainer_logp_abs_diff_mean",
    "logp_diff_max": "rollout/trainer_logp_abs_diff_max",
    "zero_variance_group_frac": "rewards/zero_variance_group_frac",
    "forking_kept_frac": "rollout/forking_kept_token_frac",
    "is_weight_mean": "off_policy/weight_mean",
    "memory_released_bytes": "rollout/memory_released_bytes",
}
# --release-memory: `build_cluster`'s `release_rollout_memory`.
RELEASE_MEMORY = {"auto": True, "kv": "kv", "weights": "weights", "off": False}
# Sized for the demo's batches (16 samples x (prompt + 16 tokens)) on CPU; `--preset` replaces
# them with the preset's.
DEMO_ENGINE_SETTINGS = dict(
    max_running_requests=16,
    precompile_bs_paddings=(1, 4, 16),
    precompile_token_paddings=(256, 1024),
    max_prefill_tokens=1024,
    context_length=256,
    max_total_tokens=4096,
)
# A task run on the real model: rows of (prompt <= 64 tokens + completion <= 16), 32 at a time
# (off TPU a step's attention grows with rows x the longest request, so both stay small). Every
# prompt starts with the same system turn, which the radix cache holds after the first call:
# a call of 32 rows prefills about 15 new tokens each, one 512-token bucket (a bucket of 2048
# costs four times as much on CPU, where prefill is most of a rollout's time).
TASK_ENGINE_SETTINGS = dict(
    max_running_requests=32,
    precompile_bs_paddings=(32,),
    precompile_token_paddings=(512,),
    max_prefill_tokens=512,
    context_length=80,
    max_total_tokens=4096,
)
TASK_PROMPT_TOKENS = 64
# A task run's size where the command line does not say (`make demo-real`): sized to 45 minutes
# of this 2-core CPU with SmolLM2-135M-Instruct on sgl-jax's own CPU attention (45-52 s a step,
# 90 s an evaluation); 17 minutes with the paged native attention (21 s a step, 15 s).
# Temperature 0.7: at 1.0 the untrained model's samples are almost never right (0 of 96 in a
# trial), so GRPO groups carry no signal; LoRA keeps the update and the weight sync small.
TASK_DEFAULTS = dict(
    steps=40,
    eval_every=10,
    prompts_per_step=8,
    num_generations=4,
    max_tokens=12,
    temperature=0.7,
    learning_rate=2e-4,
    lora_rank=16,
    lora_alpha=32.0,
)
_SUBJECTS = [
    "water",
    "time",
    "people",
    "number",
    "answer",
    "word",
    "place",
    "day",
    "work",
    "tool",
    "search",
    "plan",
    "result",
    "man",
    "sum",
    "step",
    "call",
    "way",
    "part",
]


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    algo: str = "grpo"
    rollout: str = "sglang_jax"
    steps: int = 20
    model_path: str | None = None
    out: str | None = None
    seed: int = 0
    prompts_per_step: int = 4
    num_generations: int = 4
    max_tokens: int = 16
    learning_rate: float = 1e-3
    temperature: float = 1.0
    num_iterations: int = 1  # optimizer passes over each batch
    mini_batch_size: int | None = None  # prompts per optimizer update; None: the step's all
    tis_cap: float | None = None  # GRPO / EGPO: TIS against the trainer instead of rollout-old
    # GRPO / EGPO off-policy correction (`RolloutGRPOConfig.is_correction`), with the trainer
    # as the old policy; `top_entropy_quantile`: forking tokens only carry the policy gradient.
    is_correction: str | None = None
    is_threshold: float = 2.0
    is_threshold_lower: float | None = None
    is_rejection: str = (
        "zero_weight"  # mask corrections: TRL's "zero_weight", verl's "response_mask"
    )
    top_entropy_quantile: float | None = None
    # GRPO / EGPO on a MoE: the trainer routes every token to the rollout's experts (R3); the
    # engine then returns them (`EngineSettings.return_routed_experts`)
    routing_replay: bool = False
    # GRPO / EGPO dynamic sampling (`RolloutGRPOConfig`'s fields of these names) and partial
    # rollouts (`build_cluster`'s): the step's groups may come from more prompts than its own
    filter_groups: str | None = None
    over_sampling_batch_size: int | None = None
    filter_timing: str = "slime"  # group_sampling.FILTER_TIMINGS
    partial_rollout: bool = False
    max_staleness: int = 1
    mask_offpolicy_in_partial_rollout: bool = False
    engine_settings: Any = None
    preset: str | None = None  # a tpu_configs name: meshes and engine settings of that slice
    lora_rank: int = 0  # > 0: train qwix LoRA adapters of this rank on the actor
    lora_alpha: float = 16.0
    # the engine's memory while the trainer updates (RELEASE_MEMORY): "auto" frees its KV pool
    # where the rollout shares the actor's devices
    release_memory: str = "auto"
    show_progress: bool = True
    task: str | None = None  # a name of tasks.TASKS; None: the toy task
    eval_every: int = 10  # with a task: held-out greedy accuracy every this many steps
    eval_problems: int = 200

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {self.algo!r}")
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"rollout must be one of {ROLLOUTS}, got {self.rollout!r}")
        if self.release_memory not in RELEASE_MEMORY:
            raise ValueError(
                f"release_memory must be one of {sorted(RELEASE_MEMORY)}, got "
                f"{self.release_memory!r}"
            )
        if self.rollout == "both" and self.task is None:
            raise ValueError("rollout='both' needs a task: the comparison is of task runs")
        if self.task is not None:
            from sgl_jax_rollout_apps.tasks import task

            task(self.task).held_out(self.eval_problems, self.seed)  # validates the count
            if self.eval_every < 1:
                raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
            if self.eval_problems < 1:
                raise ValueError(f"eval_problems must be >= 1, got {self.eval_problems}")
        if not (0 < self.temperature <= 2):
            raise ValueError(f"temperature must be in (0, 2], got {self.temperature}")
        for name in ("steps", "prompts_per_step", "max_tokens", "num_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2, got {self.num_generations}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if not (0 < self.learning_rate < 1):
            raise ValueError(f"learning_rate must be in (0, 1), got {self.learning_rate}")
        grpo_only = (
            "tis_cap",
            "is_correction",
            "top_entropy_quantile",
            "filter_groups",
            "over_sampling_batch_size",
        )
        for name in grpo_only:
            if self.algo == "ppo" and getattr(self, name) is not None:
                raise ValueError(f"{name} applies to grpo and egpo, not ppo")
        if samples_groups(self) and self.rollout != "sglang_jax":
            raise ValueError(
                "filter_groups, over_sampling_batch_size and partial_rollout need the sglang_jax "
                f"rollout (its generate_groups), got rollout={self.rollout!r}"
            )
        if self.partial_rollout and self.algo == "ppo":
            raise ValueError("partial_rollout applies to grpo and egpo, not ppo")
        if self.routing_replay and (self.algo == "ppo" or self.rollout != "sglang_jax"):
            raise ValueError(
                "routing_replay applies to grpo and egpo on the sglang_jax rollout (the one that "
                f"returns routed experts), got algo={self.algo!r}, rollout={self.rollout!r}"
            )
        if self.routing_replay and self.preset is not None:
            raise ValueError(
                "routing_replay with a preset: pass engine_settings with "
                "return_routed_experts=True instead of the preset's"
            )
        if self.algo != "ppo":
            self.algo_config()  # validates the GRPO settings before anything is built

    def algo_config(self, think_ids: tuple[int | None, int | None] = (None, None)):
        """The `RolloutGRPOConfig` of a grpo / egpo run: the trainer is the old policy when an
        off-policy correction is asked for, else the rollout's logprobs are."""
        from tunix_adapter.learners import RolloutGRPOConfig

        corrected = self.tis_cap is not None or self.is_correction is not None
        return RolloutGRPOConfig(
            num_generations=self.num_generations,
            num_iterations=self.num_iterations,
            beta=0.0,
            advantage_estimator="egpo" if self.algo == "egpo" else "grpo",
            use_rollout_logprobs=not corrected,
            tis_cap=self.tis_cap,
            is_correction=self.is_correction,
            is_threshold=self.is_threshold,
            is_threshold_lower=self.is_threshold_lower,
            is_rejection=self.is_rejection,
            top_entropy_quantile=self.top_entropy_quantile,
            routing_replay=self.routing_replay,
            filter_groups=self.filter_groups,
            over_sampling_batch_size=self.over_sampling_batch_size,
            filter_timing=self.filter_timing,
            mask_offpolicy_in_partial_rollout=self.mask_offpolicy_in_partial_rollout,
            think_start_id=think_ids[0],
            think_end_id=think_ids[1],
        )


def _routed(config: DemoConfig, settings: Any) -> Any:
    """`settings` (EngineSettings, a dict or None) returning routed experts where the run
    replays them."""
    if not config.routing_replay or settings is None:
        return settings
    if isinstance(settings, dict):
        return {**settings, "return_routed_experts": True}
    return settings.replace(return_routed_experts=True)


def prompts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"Tell me about the {rng.choice(_SUBJECTS)}:" for _ in range(count)]


def local_prompts(config: DemoConfig, step: int) -> list[str]:
    """This process's share of step `step`'s prompts: all of them in one process; with one
    process per host, process p's consecutive share (tunix assembles the trainer's batch from
    every process's share, in process order)."""
    index, count = share(config)
    rows = config.prompts_per_step // count
    return prompts(config.prompts_per_step, config.seed * 100_003 + step)[index * rows :][:rows]


def share(config: DemoConfig) -> tuple[int, int]:
    """(this process's index, process count); ValueError unless the prompts divide evenly."""
    from sgl_jax_rollout.engine.hosts import process_share

    index, count = process_share()
    if config.prompts_per_step % count:
        raise ValueError(
            f"prompts_per_step ({config.prompts_per_step}) must be a multiple of the JAX "
            f"process count ({count}): every host samples an equal share"
        )
    return index, count


def run(config: DemoConfig) -> list[dict[str, float]]:
    """Trains for `config.steps` global steps; returns one dict per step: every metric logged,
    by its own name and by the short names of `REPORTED`."""
    if config.out:
        require_matplotlib()
    cluster, learner = build(config)
    return train(config, cluster, learner)


def run_task(config: DemoConfig) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """A task run: (the history of `run`, with each step's time and phases; the summary of
    `TaskRun`: held-out accuracy before and after, its p-value, step times)."""
    if config.out:
        require_matplotlib()
    cluster, learner = build(config)
    from sgl_jax_rollout_apps.task_run import TaskRun

    try:
        task_run = TaskRun(config, cluster, cluster.cluster_config.rollout_config)
    except BaseException:
        _shutdown(cluster)
        raise
    history = train(config, cluster, learner, task_run=task_run)
    return history, task_run.summary()


def _rollout_micro_batch(preset: tpu_configs.Preset | None, prompts: int) -> int | None:
    """The preset's rollout micro-batch where it divides the step's prompts (tunix requires
    it), else the whole step in one rollout call."""
    if preset is None:
        return None
    if prompts % preset.rollout_micro_batch_size:
        log.info(
            "rollout micro-batch: %d prompts per step is not a multiple of the preset's %d; "
            "one rollout call per step",
            prompts,
            preset.rollout_micro_batch_size,
        )
        return None
    return preset.rollout_micro_batch_size


def build(config: DemoConfig):
    """(cluster, learner) of the demo: the toy task on the built-in model (or `model_path`)."""
    import optax

    from sgl_jax_rollout.tunix_compat import RLTrainingConfig, RolloutConfig
    from tunix_adapter.cluster import build_cluster
    from tunix_adapter.rewards import vowel_word_reward

    model_path = config.model_path
    if config.task is not None and model_path is None:
        from sgl_jax_rollout_apps.real_model import real_model_dir

        def progress(line: str) -> None:
            print(f"building SmolLM2-135M-Instruct: {line}", file=sys.stderr, flush=True)

        model_path = str(real_model_dir(progress=progress if config.show_progress else None))
    rollout_config = RolloutConfig(
        max_tokens_to_generate=config.max_tokens,
        max_prompt_length=TASK_PROMPT_TOKENS if config.task else 16,
        temperature=config.temperature,
        top_p=1.0,  # not None: tunix's vanilla sampler is greedy when top_p is None
        top_k=None,
        seed=config.seed,
        return_logprobs=True,
        kv_cache_size=128,
    )
    preset = tpu_configs.load(config.preset) if config.preset else None
    per_process = config.prompts_per_step // share(config)[1]
    training = RLTrainingConfig(
        actor_optimizer=optax.adam(config.learning_rate),
        critic_optimizer=optax.adam(config.learning_rate) if config.algo == "ppo" else None,
        eval_every_n_steps=10**9,
        max_steps=config.steps,
        mini_batch_size=config.mini_batch_size,
        rollout_micro_batch_size=_rollout_micro_batch(preset, per_process),
    )
    settings = TASK_ENGINE_SETTINGS if config.task else DEMO_ENGINE_SETTINGS
    cluster = build_cluster(
        rollout=config.rollout,
        model_path=model_path,
        rollout_config=rollout_config,
        training_config=training,
        engine_settings=_routed(config, config.engine_settings or (None if preset else settings)),
        with_reference=False,
        with_critic=config.algo == "ppo",
        preset=preset,
        lora={"rank": config.lora_rank, "alpha": config.lora_alpha} if config.lora_rank else None,
        release_rollout_memory=RELEASE_MEMORY[config.release_memory],
        partial_rollout=config.partial_rollout,
        max_staleness=config.max_staleness,
    )
    if config.task is not None:
        from sgl_jax_rollout_apps.tasks import task

        reward = task(config.task).reward
    else:
        reward = vowel_word_reward
    try:
        return cluster, _learner(config, cluster, reward)
    except BaseException:
        _shutdown(cluster)
        raise


def train(
    config: DemoConfig, cluster, learner, shutdown: bool = True, task_run: Any = None
) -> list[dict[str, float]]:
    """Runs the learner on the demo's batches (a `TaskRun`'s with a task); reports and writes
    the metrics of every step.

    Shuts the rollout down at the end unless `shutdown=False` (then the caller does).
    """
    from sgl_jax_rollout.tunix_compat import Mode

    history: list[dict[str, float]] = []
    bar = tqdm(
        total=config.steps,
        desc=f"{config.algo} ({config.rollout})",
        unit="step",
        disable=not config.show_progress,
    )

    def record(buffer) -> None:
        if str(buffer.mode) != str(Mode.TRAIN):
            return
        row: dict[str, float] = {"step": len(history)}
        for name, (values, op) in buffer.metrics.items():
            try:
                row[name] = float((op or np.mean)(np.asarray(values, np.float64)))
            except (TypeError, ValueError):  # not a number (none of the learners' metrics)
                continue
        row.update({key: row[name] for key, name in REPORTED.items() if name in row})
        if "reward_mean" not in row:
            return
        # Step 0 is the warm-up (the trainer's first step compiles); later steps should not.
        warm_up = history[0]["compiles"] if history else compiles.count
        row["compiles"] = compiles.count
        row["compiles_after_warmup"] = compiles.count - warm_up
        history.append(row)
        bar.update(1)
        bar.write(_line(row))

    cluster.with_external_metrics_logger(record)
    try:
        if task_run is not None:
            batches = task_run.batches()
        else:
            # Dynamic sampling draws more prompts than the steps' own: then the stream goes on.
            steps = itertools.count() if samples_groups(config) else range(config.steps)
            batches = (
                # numpy arrays, as tunix's data pipelines give them (it repeats them along axis 0)
                {"prompts": np.array(local_prompts(config, step))}
                for step in steps
            )
        with count_compiles() as compiles:  # read by `record`
            learner.train(batches)  # closes the cluster, which flushes the last step's metrics
        if task_run is not None:
            task_run.finish()
    except BaseException:
        _shutdown(cluster)
        raise
    finally:
        bar.close()
    if shutdown:
        _shutdown(cluster)
    if task_run is not None and config.out:
        task_run.write(output_dir(config), history)
    if config.out:
        write_outputs(history, output_dir(config), config)
    return history


def samples_groups(config: DemoConfig) -> bool:
    """Whether a step may sample more prompts than its own (dynamic sampling, partial)."""
    return bool(config.filter_groups or config.over_sampling_batch_size or config.partial_rollout)


def output_dir(config: DemoConfig) -> Path:
    """`--out`, or with one process per host `--out/process-<i>`: every process reports the
    metrics of its own share of the batch (tunix computes them per process)."""
    index, count = share(config)
    return Path(config.out) / f"process-{index}" if count > 1 else Path(config.out)


def _shutdown(cluster) -> None:
    shutdown = getattr(cluster.rollout, "shutdown", None)
    if shutdown is not None:
        shutdown()


def _learner(config: DemoConfig, cluster, reward):
    if config.algo == "ppo":
        from sgl_jax_rollout.tunix_compat import PPOConfig, ppo_learner

        return ppo_learner(
            cluster,
            PPOConfig(beta=0.0, entropy_coef=None, num_iterations=config.num_iterations),
            reward_fns=[reward],
            metric_fns=[_ppo_rollout_metrics(cluster)],
        )
    from tunix_adapter.learners import RolloutGRPOLearner

    algo = config.algo_config(_think_ids(cluster))
    return RolloutGRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=[reward])


def _think_ids(cluster) -> tuple[int | None, int | None]:
    vocab = cluster.tokenizer.tokenizer.get_vocab()
    start, end = vocab.get("<think>"), vocab.get("</think>")
    return (start, end) if start is not None and end is not None else (None, None)


def _ppo_rollout_metrics(cluster):
    """tunix's PPO learner takes metric functions: log the rollout entropy through one."""
    from sgl_jax_rollout.rollout_inputs import right_pad_values
    from tunix_adapter.metrics import rollout_metrics

    def metric_fn(prompts, completions, rewards, advantages, **_: Any):
        entropy = cluster.batch_rollout.entropy
        width = max(1, max(len(values) for values in entropy))
        mask = np.arange(width)[None, :] < np.array([len(values) for values in entropy])[:, None]
        return rollout_metrics(mask, right_pad_values(entropy, width))

    return metric_fn


def _line(row: dict[str, float]) -> str:
    parts = [f"step {row['step']:3d}", f"reward {row['reward_mean']:.3f}"]
    if "completion_length" in row:
        parts.append(f"len {row['completion_length']:.1f}")
    if "entropy_mean" in row:
        parts.append(f"entropy {row['entropy_mean']:.3f}")
    if "logp_diff_mean" in row:
        parts.append(f"|logp trainer-rollout| mean {row['logp_diff_mean']:.2e}")
        parts.append(f"max {row['logp_diff_max']:.2e}")
    if row.get("memory_released_bytes"):
        parts.append(f"released {row['memory_released_bytes'] / 2**20:.1f} MiB")
    return "  ".join(parts)


def write_outputs(history: list[dict[str, float]], out: Path, config: DemoConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "w") as f:
        for row in history:
            f.write(json.dumps({**row, "algo": config.algo, "rollout": config.rollout}) + "\n")
    training_curves(
        {config.rollout: history},
        out / "metrics.png",
        f"{config.algo.upper()} with the {config.rollout} rollout",
    )
