"""The main job: `sgl-jax-rollout demo`: GRPO / EGPO / PPO on the built-in model, on CPU, or
tunix's agentic GRPO learner (`learner="agentic"`: its learner and sizes in `agentic_demo`).

Owns the run: `build` (the cluster and the learner, on the toy task, `rewards.vowel_word_reward`,
or on a real task, `--task NAME`: a task of `tasks.TASKS` on a real checkpoint, by default
SmolLM2-135M-Instruct from `real_model`), `train` (the learner on each step's batch, reported
per step), `run`, `run_task` (held-out evaluation and step timing from `task_run`; `--rollout
both` runs it with each rollout on the same seeds) and the training configuration of each
algorithm. Every number comes from tunix's metrics buffer, through the cluster's external
logger.

What it runs on, every public name importable from here too: `demo_config` (`DemoConfig`, the
engine settings, `TASK_DEFAULTS`), `demo_prompts` (the toy task's prompts, each process's share
of them) and `demo_output` (the per-step report under a tqdm bar: reward mean, completion
length, rollout entropy mean, trainer/rollout logprob difference; and the outputs in `--out`).

With one process per host (`sgl-jax-rollout launch ... -- demo --preset cpu-2host`), every
process samples its share of each step's prompts (`local_prompts`) and reports the metrics of
that share, in `--out/process-<i>/`.
"""

from __future__ import annotations

import itertools
import logging
import sys
from typing import Any

import numpy as np
from tqdm import tqdm

import tpu_configs
from sgl_jax_rollout.utils.compiles import count_compiles
from sgl_jax_rollout_apps.demo_config import (
    ALGOS,
    DEMO_ENGINE_SETTINGS,
    RELEASE_MEMORY,
    ROLLOUTS,
    TASK_DEFAULTS,
    TASK_ENGINE_SETTINGS,
    TASK_PROMPT_TOKENS,
    DemoConfig,
    samples_groups,
)
from sgl_jax_rollout_apps.demo_output import (
    AGENTIC_REPORTED,
    REPORTED,
    output_dir,
    step_line,
    write_outputs,
)
from sgl_jax_rollout_apps.demo_prompts import local_prompts, prompts, share
from sgl_jax_rollout_apps.plotting import require_matplotlib

__all__ = [
    "ALGOS",
    "DEMO_ENGINE_SETTINGS",
    "RELEASE_MEMORY",
    "REPORTED",
    "ROLLOUTS",
    "TASK_DEFAULTS",
    "TASK_ENGINE_SETTINGS",
    "TASK_PROMPT_TOKENS",
    "DemoConfig",
    "build",
    "local_prompts",
    "output_dir",
    "prompts",
    "run",
    "run_task",
    "samples_groups",
    "share",
    "train",
    "write_outputs",
]

log = logging.getLogger(__name__)


def _routed(config: DemoConfig, settings: Any) -> Any:
    """`settings` (EngineSettings, a dict or None) returning routed experts where the run
    replays them."""
    if not config.routing_replay or settings is None:
        return settings
    if isinstance(settings, dict):
        return {**settings, "return_routed_experts": True}
    return settings.replace(return_routed_experts=True)


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


def _train_batches(config: DemoConfig, prompts: int) -> dict[str, int | None]:
    """tunix's mini_batch_size and train_micro_batch_size (which needs the first)."""
    micro = config.train_micro_batch_size
    mini = config.mini_batch_size or (prompts if micro is not None else None)
    return {"mini_batch_size": mini, "train_micro_batch_size": micro}


def build(config: DemoConfig):
    """(cluster, learner) of the demo: the toy task on the built-in model (or `model_path`)."""
    import optax

    from sgl_jax_rollout.tunix_compat import RLTrainingConfig, RolloutConfig
    from tunix_adapter.cluster import build_cluster
    from tunix_adapter.rewards import vowel_word_reward

    model_path = config.model_path
    if model_path is None and (config.task is not None or config.model is not None):
        model_path = _real_model(config)
    stops = _task_stop_ids(config, model_path) if config.task is not None else []
    max_tokens, prompt_tokens = config.max_tokens, TASK_PROMPT_TOKENS if config.task else 16
    settings = TASK_ENGINE_SETTINGS if config.task else DEMO_ENGINE_SETTINGS
    release = RELEASE_MEMORY[config.release_memory]
    if config.learner == "agentic":
        from sgl_jax_rollout_apps import agentic_demo

        first = agentic_demo.first_prompt_tokens(config, _tokenizer(model_path))
        max_tokens = agentic_demo.episode_tokens(config)  # tunix asks for max_response_length
        token_in = config.rollout == "sglang_jax"  # `agentic_demo.learner` serves it so
        prompt_tokens = agentic_demo.prompt_tokens(config, first, token_in)
        settings = agentic_demo.engine_settings(agentic_demo.context_tokens(config, first))
        if config.release_memory == "auto":  # episodes may be sampled while the trainer updates
            release = False
    rollout_config = RolloutConfig(
        max_tokens_to_generate=max_tokens,
        max_prompt_length=prompt_tokens,
        temperature=config.temperature,
        top_p=1.0,  # not None: tunix's vanilla sampler is greedy when top_p is None
        top_k=None,
        seed=config.seed,
        return_logprobs=True,
        kv_cache_size=max(128, prompt_tokens + max_tokens),
        eos_tokens=stops or None,
    )
    preset = tpu_configs.load(config.preset) if config.preset else None
    per_process = config.prompts_per_step // share(config)[1]
    training = RLTrainingConfig(
        actor_optimizer=optax.adam(config.learning_rate),
        critic_optimizer=optax.adam(config.learning_rate) if config.algo == "ppo" else None,
        eval_every_n_steps=10**9,
        max_steps=config.steps,
        **_train_batches(config, per_process),
        rollout_micro_batch_size=_rollout_micro_batch(preset, per_process),
    )
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
        release_rollout_memory=release,
        partial_rollout=config.partial_rollout,
        max_staleness=config.max_staleness,
    )
    if config.task is not None:
        from sgl_jax_rollout_apps.tasks import prompt_style, task

        reward = task(config.task).reward_fn(prompt_style(config.prompt_style, cluster.tokenizer))
    else:
        reward = vowel_word_reward
    try:
        return cluster, _learner(config, cluster, reward)
    except BaseException:
        _shutdown(cluster)
        raise


def _real_model(config: DemoConfig) -> str:
    """The directory of `config.model` (default: SmolLM2-135M-Instruct), built on first use."""
    from sgl_jax_rollout_apps.real_model import DEFAULT_MODEL, MODELS, real_model_dir

    name = config.model or DEFAULT_MODEL

    def progress(line: str) -> None:
        print(f"building {MODELS[name].TITLE}: {line}", file=sys.stderr, flush=True)

    return str(real_model_dir(progress=progress if config.show_progress else None, model=name))


def _tokenizer(model_path: str | None) -> Any:
    """The Hugging Face tokenizer of `model_path` (default: the built-in model), read before
    the engine starts."""
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tiny_model import default_model_dir

    return AutoTokenizer.from_pretrained(model_path or default_model_dir())


def _task_stop_ids(config: DemoConfig, model_path: str | None) -> list[int]:
    """The rollout's `eos_tokens` for the task's prompt style: none (the model's EOS ids) for
    chat prompts; the EOS id and `tasks.stop_ids` for few-shot ones (tunix's vanilla sampler
    stops at `eos_tokens` alone, ours at them and the model's EOS ids). ValueError for a style
    the tokenizer cannot give, before the engine is started."""
    from sgl_jax_rollout_apps.tasks import prompt_style, stop_ids

    tokenizer = _tokenizer(model_path)
    style = prompt_style(config.prompt_style, tokenizer)
    stops = stop_ids(tokenizer, style)
    log.info("task prompts: %s style, stop ids %s", style, stops or "the model's EOS")
    return [tokenizer.eos_token_id, *stops] if stops else []


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
        row.update({k: row[name] for k, name in AGENTIC_REPORTED.items() if name in row})
        if "reward_mean" not in row:
            return
        if len(history) >= config.steps:
            # tunix's agentic producer samples `off_policy_steps` batches ahead; at max_steps
            # it stops training and flushes their rollout metrics, with no update behind them
            bar.write(
                f"a batch sampled ahead (off_policy_steps {config.off_policy_steps}) was not "
                f"trained: tunix stopped at max_steps {config.steps}; its metrics are left out"
            )
            return
        # Step 0 is the warm-up (the trainer's first step compiles); later steps should not.
        warm_up = history[0]["compiles"] if history else compiles.count
        row["compiles"] = compiles.count
        row["compiles_after_warmup"] = compiles.count - warm_up
        history.append(row)
        bar.update(1)
        bar.write(step_line(row))

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


def _shutdown(cluster) -> None:
    shutdown = getattr(cluster.rollout, "shutdown", None)
    if shutdown is not None:
        shutdown()


def _learner(config: DemoConfig, cluster, reward):
    if config.learner == "agentic":
        from sgl_jax_rollout_apps import agentic_demo

        return agentic_demo.learner(config, cluster, reward)
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
