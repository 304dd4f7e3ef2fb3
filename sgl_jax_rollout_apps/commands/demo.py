"""`sgl-jax-rollout demo`: the main job, GRPO / EGPO / PPO on a toy or a real task.

Owns the subparser (with the variant flags of `variant_flags` and the dynamic sampling,
partial rollout and agentic learner flags of `demo_flags`), the translation of the flags into a
`DemoConfig`, and the handler: one run (`sgl_jax_rollout_apps.demo.run`), a task run with one
or both rollouts (`run_task`, `task_run.compare`) or a sweep (`sweep.run_sweep`), each summed
up in one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from sgl_jax_rollout_apps.commands.demo_flags import (
    add_agentic_flags,
    add_group_sampling_flags,
    agentic_fields,
    group_sampling_fields,
)
from sgl_jax_rollout_apps.commands.engine import engine_missing
from sgl_jax_rollout_apps.commands.variant_flags import add_variant_flags, variant_fields

# --tools: a turn holds a tool call (`<tool_call>` and its JSON: about 35 tokens)
TOOL_TURN_TOKENS = 48
RUN_SIZE_FLAGS = (
    "steps",
    "prompts_per_step",
    "num_generations",
    "max_tokens",
    "temperature",
    "learning_rate",
    "lora_rank",
    "lora_alpha",
    "eval_every",
)


def add_parser(sub: argparse._SubParsersAction, presets: str) -> None:
    from sgl_jax_rollout_apps.real_model import DEFAULT_MODEL, MODELS
    from sgl_jax_rollout_apps.tasks import PROMPT_STYLES, SHOTS, TASKS

    demo = sub.add_parser(
        "demo",
        help="train the built-in model on a toy task (GRPO / EGPO / PPO) on CPU",
        description="Trains with tunix on a toy task (reward: the share of words that start "
        "with a vowel), printing per step the reward mean, completion length, rollout "
        "entropy and trainer/rollout logprob difference; writes metrics.jsonl and "
        "metrics.png to --out.",
    )
    demo.add_argument(
        "--algo",
        choices=["grpo", "egpo", "ppo"],
        default="grpo",
        help="the learner: tunix's GRPO, EGPO (GRPO with entropy-weighted advantages) or PPO",
    )
    demo.add_argument(
        "--rollout",
        choices=["sglang_jax", "vanilla", "both"],
        default="sglang_jax",
        help="both (with --task): the same run with each rollout, on the same seeds",
    )
    demo.add_argument(
        "--task",
        choices=sorted(TASKS),
        default=None,
        help="a real task with a verifiable reward and held-out greedy accuracy (on --model or "
        "--model-path; run-size flags not given take the task run's defaults, "
        "demo.TASK_DEFAULTS) (default: the toy task)",
    )
    demo.add_argument(
        "--model",
        choices=list(MODELS),
        default=None,
        help="the real checkpoint to train, built by make-real-model on first use; not with "
        f"--model-path (default: with --task, {DEFAULT_MODEL})",
    )
    demo.add_argument(
        "--prompt-style",
        choices=PROMPT_STYLES,
        default="auto",
        help="--task: chat (the task's system message in the model's chat template), few-shot "
        f"({SHOTS} solved problems, one a line, then the question; the answer ends at a "
        "newline), or auto: chat where the tokenizer has a chat template (default: auto)",
    )
    demo.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="--task: held-out accuracy every N steps (default: 10; gemma3-270m: 5)",
    )
    demo.add_argument(
        "--eval-problems", type=int, default=200, help="--task: held-out problems (distinct)"
    )
    demo.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="tokens generated per sample (default: 16; with --task: 12)",
    )
    demo.add_argument(
        "--num-generations",
        type=int,
        default=None,
        help="samples per prompt, a GRPO group, >= 2 (default: 4)",
    )
    demo.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="actor learning rate, Adam (default: 1e-3; with --task: 2e-4, gemma3-270m: 1e-5)",
    )
    demo.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps, >= 1 (default: 20; with --task: 40, gemma3-270m: 20)",
    )
    demo.add_argument(
        "--prompts-per-step",
        type=int,
        default=None,
        help="prompts per step, over every host, a multiple of the JAX process count "
        "(default: 4; with --task: 8)",
    )
    demo.add_argument(
        "--model-path", default=None, help="HF model dir (default: the built-in tiny model)"
    )
    demo.add_argument("--out", default="demo_out", help="output directory (default: demo_out)")
    demo.add_argument(
        "--seed", type=int, default=0, help="seeds the prompts, the sampling and the init"
    )
    demo.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="rollout temperature (default: 1; with --task: 0.7)",
    )
    demo.add_argument(
        "--num-iterations",
        type=int,
        default=1,
        help="optimizer passes over each batch (grpo / egpo, > 1: the old policy's logprobs "
        "come from the rollout, or from the trainer with an off-policy correction)",
    )
    demo.add_argument(
        "--mini-batch-size",
        type=int,
        default=None,
        help="prompts per optimizer update, tunix's mini_batch_size; the weights reach the "
        "rollout once per step, and --steps counts updates, tunix's max_steps (default: the "
        "step's prompts)",
    )
    demo.add_argument(
        "--train-micro-batch-size",
        type=int,
        default=None,
        help="prompts per train step, tunix's train_micro_batch_size: each update's gradient "
        "is accumulated over steps of this many prompts' samples, to fit memory (default: the "
        "mini-batch)",
    )
    demo.add_argument(
        "--tis-cap",
        type=float,
        default=None,
        help="grpo / egpo: old policy = trainer, truncated importance sampling at this cap "
        "(the same as --is-correction token-truncate --is-threshold CAP) (default: none, the "
        "rollout's logprobs are the old policy)",
    )
    add_variant_flags(demo)
    add_group_sampling_flags(demo)
    add_agentic_flags(demo)
    demo.add_argument(
        "--sweep",
        action="store_true",
        help="run GRPO, GRPO on forking tokens (rho = --top-entropy-quantile, 0.2 where not "
        "given) and EGPO for --steps each, per seed; curves of all in --out/sweep.png",
    )
    demo.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="--sweep: seeds (default: --seed)"
    )
    demo.add_argument(
        "--preset",
        default=None,
        help=f"slice preset from tpu_configs ({presets}): meshes and engine settings; its "
        "device count must match this machine",
    )
    demo.add_argument(
        "--lora-rank",
        type=int,
        default=None,
        help="train qwix LoRA adapters of this rank on the actor, 0: full weights; the engine "
        "serves them unmerged (default: 0; with --task: 16)",
    )
    demo.add_argument(
        "--lora-alpha",
        type=float,
        default=None,
        help="LoRA alpha, scaling alpha / rank (default: 16; with --task: 32)",
    )
    demo.add_argument(
        "--release-memory",
        choices=("auto", "kv", "weights", "off"),
        default="auto",
        help="the rollout engine's device memory while the trainer updates: auto frees its KV "
        "pool where it shares the actor's devices, weights its parameters too (back with the "
        "next sync), off keeps both; the step line prints what was freed (default: auto)",
    )
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    if args.preset is not None:
        import tpu_configs

        try:
            tpu_configs.load(args.preset).check_devices()
        except tpu_configs.PresetError as err:
            print(f"sgl-jax-rollout: error: --preset: {err}", file=sys.stderr)
            return 2
    if args.rollout == "both" and args.task is None:
        print("sgl-jax-rollout: error: demo: --rollout both needs --task", file=sys.stderr)
        return 2
    if args.rollout != "vanilla" and engine_missing(
        "(or run the demo on tunix's rollout: --rollout vanilla)"
    ):
        return 2
    from sgl_jax_rollout_apps.demo import DemoConfig, output_dir, run, share
    from sgl_jax_rollout_apps.plotting import require_matplotlib

    if args.out:
        try:
            require_matplotlib()
        except ImportError as err:
            print(f"sgl-jax-rollout: error: demo --out: {err}", file=sys.stderr)
            return 2

    try:
        config = DemoConfig(
            algo=args.algo,
            rollout=args.rollout,
            model_path=args.model_path,
            model=args.model,
            prompt_style=args.prompt_style,
            out=args.out,
            seed=args.seed,
            num_iterations=args.num_iterations,
            mini_batch_size=args.mini_batch_size,
            train_micro_batch_size=args.train_micro_batch_size,
            tis_cap=args.tis_cap,
            **variant_fields(args),
            **group_sampling_fields(args),
            **agentic_fields(args),
            preset=args.preset,
            task=args.task,
            eval_problems=args.eval_problems,
            release_memory=args.release_memory,
            **_run_size_fields(args),
        )
        share(config)
    except ValueError as err:
        print(f"sgl-jax-rollout: error: demo: {err}", file=sys.stderr)
        return 2
    if args.sweep:
        return _sweep(dataclasses.replace(config, top_entropy_quantile=None), args)
    if config.task is not None:
        return _task(config)
    history = run(config)
    first, last = history[0]["reward_mean"], history[-1]["reward_mean"]
    out = output_dir(config) if args.out else None
    learner = " (tunix's agentic learner)" if config.learner == "agentic" else ""
    print(
        f"{args.algo}{learner} with the {args.rollout} rollout: {len(history)} steps, reward mean "
        f"{first:.3f} -> {last:.3f}, {history[-1]['compiles_after_warmup']} XLA compiles "
        f"after step 0; metrics in {out}/metrics.jsonl, plot in {out}/metrics.png"
    )
    return 0


def _run_size_fields(args: argparse.Namespace) -> dict:
    """The run-size flags given; with --task, the task run's defaults for the others
    (`TASK_DEFAULTS`, under --model's own `MODEL_TASK_DEFAULTS`; else `DemoConfig`'s)."""
    from sgl_jax_rollout_apps.demo_config import MODEL_TASK_DEFAULTS, TASK_DEFAULTS

    given = {name: getattr(args, name) for name in RUN_SIZE_FLAGS}
    given = {name: value for name, value in given.items() if value is not None}
    tools = {"max_tokens": TOOL_TURN_TOKENS} if args.tools else {}
    if not args.task:
        return {**tools, **given}
    return {**TASK_DEFAULTS, **MODEL_TASK_DEFAULTS.get(args.model, {}), **tools, **given}


def _task(config) -> int:
    from sgl_jax_rollout_apps import demo, task_run
    from sgl_jax_rollout_apps.tasks import PromptStyleError

    try:
        if config.rollout == "both":
            summaries = task_run.compare(config, demo.run_task)
            where = f"{config.out}/summary.json, plot in {config.out}/task.png"
        else:
            summaries = {config.rollout: demo.run_task(config)[1]}
            where = f"{demo.output_dir(config)}/summary.json" if config.out else "not written"
    except PromptStyleError as err:  # found once the checkpoint is there, before its engine
        print(f"sgl-jax-rollout: error: demo --prompt-style: {err}", file=sys.stderr)
        return 2
    for rollout, s in summaries.items():
        tools = ""
        if "tool_call_share_before" in s:
            tools = (
                f", episodes calling the tool {s['tool_call_share_before']:.3f} -> "
                f"{s['tool_call_share_after']:.3f}"
            )
        print(
            f"{config.task} with the {rollout} rollout: held-out greedy accuracy "
            f"{s['accuracy_before']:.3f} -> {s['accuracy_after']:.3f} ({s['gain_points']:+.1f} "
            f"points, p = {s['p_value']:.2g}, {s['eval_problems']} problems{tools}), "
            f"{s['step_seconds_median']:.1f} s per step"
        )
    print(f"summary in {where}")
    return 0


def _sweep(config, args: argparse.Namespace) -> int:
    from sgl_jax_rollout_apps import sweep
    from tunix_adapter.forking import check_quantile

    seeds = args.seeds or [args.seed]
    rho = args.top_entropy_quantile if args.top_entropy_quantile is not None else 0.2
    try:
        check_quantile(rho)
    except ValueError as err:
        print(f"sgl-jax-rollout: error: demo --sweep: {err}", file=sys.stderr)
        return 2
    runs = sweep.run_sweep(config, seeds, rho)
    print(json.dumps(sweep.summary(runs), indent=2))
    print(f"curves in {args.out}/sweep.png, every step in {args.out}/sweep.jsonl")
    return 0
