"""`sgl-jax-rollout bench TARGET`: the benchmarks, each printing one JSON object.

Owns the subparser, the argument checks that depend on the target, and the handler, which runs
one module of `sgl_jax_rollout_apps.bench`; exit 1 when its result is not ok, 2 without the
engine (every target but `sampler` needs it).
"""

from __future__ import annotations

import argparse
import json

from sgl_jax_rollout_apps.commands.engine import engine_missing


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks printing one JSON object")
    bench.add_argument(
        "target",
        choices=[
            "sampler",
            "rollout",
            "weights",
            "soak",
            "memory",
            "replay",
            "tail",
            "grpo",
            "start",
            "attention",
            "concurrency",
            "agentic",
            "lora",
        ],
        help="sampler: ms per sampling step; rollout: tokens/s of the rollouts; weights: "
        "update_params vs device_put; soak: many mixed requests, every completion checked "
        "(exit 1 on a bad one or on memory growth); memory: the engine's memory released "
        "and resumed (exit 1 on a missed target); replay: a MoE's bfloat16 rollout vs float32 "
        "trainer logprobs with and without routing replay, and the cost of returning routed "
        "experts (exit 1 if replay leaves a routing difference or cuts the mean gap < 5x); "
        "tail: GRPO batches with long-tailed lengths, today's call vs shared group prefill "
        "vs over-sampling with early stop vs partial rollouts, on the built-in and the "
        "Qwen3-0.6B-sized model (exit 1 on a missed target); grpo: wall time of "
        "whole GRPO steps and each phase's share, our rollout (also without shared prefill, "
        "with over-sampling and with DAPO's filter) vs tunix's own sgl-jax rollout vs "
        "VanillaRollout; start: engine starts with the compilation cache cold, warm and off "
        "(the real checkpoint by default; exit 1 if a warm start takes over 1/3 of one "
        "without the cache); attention: decode step and prefill times under sgl-jax's own "
        "native attention and ours, on the built-in model and the real checkpoint (exit 1 if "
        "ours is under 5x faster at 64 rows x 1,024 context on the real one, or slower at 8 x "
        "128, or any greedy token differs); concurrency: 1 / 4 / 16 / 32 one-prompt calls "
        "from as many threads at once vs one call of the same prompts (exit 1 if 16 or 32 "
        "calls take over 1.3x the one call, or any seeded completion differs); agentic: "
        "tunix's AgenticGRPOLearner steps with our rollout vs VanillaRollout, off_policy_steps "
        "0 and 1, on the built-in and the Qwen3-0.6B-sized model (exit 1 if ours is under 2x "
        "vanilla's steps/s there, or slower with off_policy_steps 1 than 0); lora: a bfloat16 "
        "engine's logprob move after 1 / 10 / 100 Adam steps on LoRA adapters against the "
        "bfloat16 trainer's (exit 1 if they correlate under 0.8 after 10)",
    )
    bench.add_argument("--json", action="store_true", help="print compact JSON on one line")
    bench.add_argument(
        "--steps",
        type=int,
        default=None,
        help="sampler: timed steps, >= 20; grpo: timed GRPO steps, >= 3; agentic: timed steps "
        "per variant, >= 3 (default: sampler 20, grpo 5, agentic 4)",
    )
    bench.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="agentic: tokens per episode at most, in [1, 1,024] (default: 16)",
    )
    bench.add_argument(
        "--runs",
        type=int,
        default=5,
        help="rollout / weights / memory / replay / concurrency: timed runs (>= 5); tail: "
        "timed batches; "
        "start: turns of cold, warm and uncached starts (>= 1)",
    )
    bench.add_argument(
        "--workers",
        type=int,
        default=1,
        help="grpo: processes per variant, the variants taken in turn, their timed steps "
        "pooled (>= 1)",
    )
    bench.add_argument(
        "--variants",
        default=None,
        help="grpo: comma-separated variants to run; ours_rollout_old, the "
        "reference, always runs (default: all)",
    )
    bench.add_argument(
        "--model-path",
        default=None,
        help="rollout / weights / soak / memory / replay / tail / start / attention / "
        "concurrency / agentic / lora: HF model "
        "dir (default: tiny model; replay: the Qwen3-MoE replica in bfloat16; start: the real "
        "checkpoint, SmolLM2-135M-Instruct; attention: both the built-in model and that one)",
    )
    bench.add_argument(
        "--real-size-layers",
        type=int,
        default=2,
        help="rollout / memory / grpo / tail / agentic: layers of the second, Qwen3-0.6B-sized "
        "model "
        "(generated "
        "offline on first use, 620 MB + 63 MB per layer; 0 skips it)",
    )
    bench.add_argument(
        "--no-group-prefill",
        action="store_true",
        help="tail: skip the 16 x 8 x 1,000-token prefill figure (its unshared half takes about "
        "30 minutes on a 2-core CPU)",
    )
    bench.add_argument(
        "--starts",
        type=int,
        default=3,
        help="rollout: engine starts per column, the runs spread over them (1..runs)",
    )
    bench.add_argument(
        "--requests",
        type=int,
        default=1000,
        help="soak: prompts in all (>= 8 + cycles: one per call)",
    )
    bench.add_argument(
        "--cycles",
        type=int,
        default=None,
        help="soak: generate + update_params cycles measured for memory growth, >= 1; "
        "memory: release / resume / generate cycles (default: soak 50, memory 20)",
    )
    bench.add_argument(
        "--numerics",
        choices=["trainer", "sgl-jax"],
        default="trainer",
        help="lora: how the bfloat16 engine rounds, EngineSettings.numerics (default: trainer)",
    )
    bench.add_argument("--seed", type=int, default=0, help="soak: prompts, mix and sampling")
    bench.add_argument(
        "--vocab",
        type=int,
        default=151_936,
        help="sampler: the logits' width (Qwen's 151,936; Gemma 3's is 262,144), a multiple of 8 "
        "in [1,024, 1,048,576]",
    )
    bench.set_defaults(func=_bench)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Sets `--steps`'s default for the target; `parser.error` on flags out of its range."""
    lowest, default = {"grpo": (3, 5), "agentic": (3, 4)}.get(args.target, (20, 20))
    if args.steps is None:
        args.steps = default
    if args.steps < lowest:
        parser.error(f"--steps must be >= {lowest} for bench {args.target}, got {args.steps}")
    fewest_runs = 1 if args.target == "start" else 5
    if args.runs < fewest_runs:
        parser.error(f"--runs must be >= {fewest_runs}, got {args.runs}")
    if args.target == "rollout" and not 1 <= args.starts <= args.runs:
        parser.error(f"--starts must be in [1, --runs ({args.runs})], got {args.starts}")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if args.target == "grpo" and args.variants is not None:
        from sgl_jax_rollout_apps.bench.grpo_bench import check_variants

        try:
            args.variants = check_variants(tuple(filter(None, args.variants.split(","))))
        except ValueError as err:
            parser.error(f"--variants: {err}")
    if args.tokens is not None:
        from sgl_jax_rollout_apps.bench.agentic_bench import check_tokens

        if args.target != "agentic":
            parser.error(f"--tokens applies to bench agentic, not bench {args.target}")
        try:
            check_tokens(args.tokens)
        except ValueError as error:
            parser.error(str(error))
    if not 0 <= args.real_size_layers <= 28:
        parser.error(f"--real-size-layers must be in [0, 28], got {args.real_size_layers}")
    if args.target == "sampler":
        from sgl_jax_rollout_apps.bench.sampler_bench import check_vocab

        try:
            check_vocab(args.vocab)
        except ValueError as error:
            parser.error(str(error))


def _bench(args: argparse.Namespace) -> int:
    if args.target != "sampler" and engine_missing():  # every other target starts the engine
        return 2
    if args.target == "sampler":
        from sgl_jax_rollout_apps.bench import sampler_bench

        result = sampler_bench.run(steps=args.steps, vocab=args.vocab)
    elif args.target == "memory":
        from sgl_jax_rollout_apps.bench import memory_bench

        result = memory_bench.run(
            model_dir=args.model_path,
            runs=args.runs,
            cycles=args.cycles or 20,
            real_size_layers=args.real_size_layers,
        )
    elif args.target == "soak":
        from sgl_jax_rollout_apps.bench import soak

        result = soak.run(
            requests=args.requests,
            cycles=args.cycles or 50,
            seed=args.seed,
            model_path=args.model_path,
        )
    elif args.target == "start":
        from sgl_jax_rollout_apps.bench import start_bench

        result = start_bench.run(model_dir=args.model_path, runs=args.runs)
    elif args.target == "attention":
        from sgl_jax_rollout_apps.bench import attention_bench

        result = attention_bench.run(model_dir=args.model_path)
    elif args.target == "concurrency":
        from sgl_jax_rollout_apps.bench import concurrency_bench

        result = concurrency_bench.run(model_dir=args.model_path, runs=args.runs)
    elif args.target == "agentic":
        from sgl_jax_rollout_apps.bench import agentic_bench

        result = agentic_bench.run(
            model_dir=args.model_path,
            steps=args.steps,
            real_size_layers=args.real_size_layers,
            tokens=args.tokens or agentic_bench.TOKENS,
        )
    elif args.target == "lora":
        from sgl_jax_rollout_apps.bench import lora_bench

        result = lora_bench.run(model_dir=args.model_path, numerics=args.numerics)
    elif args.target == "tail":
        from sgl_jax_rollout_apps.bench import tail

        result = tail.run(
            model_dir=args.model_path,
            batches=args.runs,
            group_prefill=not args.no_group_prefill,
            real_size_layers=args.real_size_layers,
        )
    elif args.target == "grpo":
        from sgl_jax_rollout_apps.bench import grpo_bench

        result = grpo_bench.run(
            model_dir=args.model_path,
            steps=args.steps,
            real_size_layers=args.real_size_layers,
            workers=args.workers,
            variants=args.variants,
        )
    elif args.target == "replay":
        from sgl_jax_rollout_apps.bench import replay_bench

        result = replay_bench.run(model_dir=args.model_path, runs=args.runs)
    else:
        from sgl_jax_rollout_apps.bench import rollout_bench

        if args.target == "rollout":
            result = rollout_bench.run_rollout(
                model_dir=args.model_path,
                runs=args.runs,
                real_size_layers=args.real_size_layers,
                starts=args.starts,
            )
        else:
            result = rollout_bench.run_weights(model_dir=args.model_path, runs=args.runs)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0 if result.get("ok", True) else 1
