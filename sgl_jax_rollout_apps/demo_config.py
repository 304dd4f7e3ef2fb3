"""What a demo run is: `DemoConfig`, its checks, and the sizes a run takes where it says none.

Owns the configuration of `sgl-jax-rollout demo` (the algorithm, the rollout, the run's size,
the GRPO / EGPO variants, dynamic sampling and partial rollouts, the preset, LoRA, memory
release, the task) with the checks that fail fast, before anything is built; the engine
settings of the toy and the task runs (`DEMO_ENGINE_SETTINGS`, `TASK_ENGINE_SETTINGS`); and the
task run's defaults (`TASK_DEFAULTS`, and a real checkpoint's own, `MODEL_TASK_DEFAULTS`). Must
not build or run anything (`demo` does).
"""

from __future__ import annotations

import dataclasses
from typing import Any

ALGOS = ("grpo", "egpo", "ppo")
ROLLOUTS = ("sglang_jax", "vanilla", "both")
# default: tunix's GRPO / PPO learners (one rollout call a batch); agentic: tunix's
# AgenticGRPOLearner (episodes, one chat a call, many at once: `agentic_demo`)
LEARNERS = ("default", "agentic")
TOOLS = ("calculator",)
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

# `--model NAME`'s own task-run defaults over TASK_DEFAULTS. Gemma 3 270M (few-shot prompts):
# Adam at 2e-4 on the LoRA adapters broke it within two steps (held-out accuracy 0.375 ->
# 0.010 after 3 steps, completions no longer ending at a newline); at 2e-5 it was 0.625 after
# 5 steps and 0.510 after 10; at 1e-5, 0.565 after 20 (0.375 before). At about 55 s a step, 20
# steps and five evaluations take 25 minutes with our rollout.
MODEL_TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3-270m": dict(steps=20, eval_every=5, learning_rate=1e-5),
}


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
    # prompts per train step (tunix's train_micro_batch_size: the update's gradient accumulated
    # over steps of this many prompts' samples); None: the mini-batch
    train_micro_batch_size: int | None = None
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
    # with a task and no model_path: the real checkpoint (real_model.MODELS) built on first use
    model: str | None = None
    prompt_style: str = "auto"  # with a task: tasks.PROMPT_STYLES
    eval_every: int = 10  # with a task: held-out greedy accuracy every this many steps
    eval_problems: int = 200
    learner: str = "default"  # LEARNERS
    # learner="agentic": tunix's AgenticGRPOConfig fields of these names, and the tool of
    # multi-turn episodes (TOOLS; the arithmetic task)
    tools: str | None = None
    off_policy_steps: int = 0
    max_concurrency: int = 16

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
        if self.model is not None:
            from sgl_jax_rollout_apps.real_model import MODELS

            if self.model not in MODELS:
                raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
            if self.model_path is not None:
                raise ValueError("model and model_path name the checkpoint twice: give one")
        if self.task is not None:
            from sgl_jax_rollout_apps.tasks import check_prompt_style, task

            task(self.task).held_out(self.eval_problems, self.seed)  # validates the count
            check_prompt_style(self.prompt_style)
            if self.eval_every < 1:
                raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
            if self.eval_problems < 1:
                raise ValueError(f"eval_problems must be >= 1, got {self.eval_problems}")
        if not (0 < self.temperature <= 2):
            raise ValueError(f"temperature must be in (0, 2], got {self.temperature}")
        for name in ("steps", "prompts_per_step", "max_tokens", "num_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        micro, mini = self.train_micro_batch_size, self.mini_batch_size or self.prompts_per_step
        if micro is not None and (micro < 1 or mini % micro):
            raise ValueError(
                f"train_micro_batch_size must be >= 1 and divide the mini-batch ({mini} "
                f"prompts), got {micro}"
            )
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
        self._check_learner()
        if self.algo != "ppo" and self.learner == "default":
            self.algo_config()  # validates the GRPO settings before anything is built

    def _check_learner(self) -> None:
        """ValueError for an agentic setting without the agentic learner, or a setting the
        agentic learner does not have."""
        if self.learner not in LEARNERS:
            raise ValueError(f"learner must be one of {LEARNERS}, got {self.learner!r}")
        if self.learner == "default":
            for name, default in (("tools", None), ("off_policy_steps", 0)):
                if getattr(self, name) != default:
                    raise ValueError(f"{name} applies to learner='agentic'")
            return
        if self.algo != "grpo":
            raise ValueError(
                f"learner='agentic' is tunix's agentic GRPO: algo 'grpo', got {self.algo!r}"
            )
        if self.tools is not None and self.tools not in TOOLS:
            raise ValueError(f"tools must be None or one of {TOOLS}, got {self.tools!r}")
        if self.tools is not None and self.task != "arithmetic":
            raise ValueError(f"tools={self.tools!r} needs task='arithmetic', got {self.task!r}")
        if self.off_policy_steps < 0:
            raise ValueError(f"off_policy_steps must be >= 0, got {self.off_policy_steps}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        unsupported = {
            "tis_cap": None,
            "is_correction": None,
            "top_entropy_quantile": None,
            "routing_replay": False,
        }
        for name, default in unsupported.items():
            if getattr(self, name) != default:
                raise ValueError(f"{name} does not apply to learner='agentic'")
        if samples_groups(self):
            raise ValueError(
                "filter_groups, over_sampling_batch_size and partial_rollout do not apply to "
                "learner='agentic' (tunix's agentic learner samples each group once)"
            )

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


def samples_groups(config: DemoConfig) -> bool:
    """Whether a step may sample more prompts than its own (dynamic sampling, partial)."""
    return bool(config.filter_groups or config.over_sampling_batch_size or config.partial_rollout)
