"""`sgl-jax-rollout compare`: our rollout side by side with tunix's.

Owns the subparser and the handler, which runs `sgl_jax_rollout_apps.compare` and prints its
table; exit 2 when the rollout compared against cannot run here.
"""

from __future__ import annotations

import argparse
import sys

from sgl_jax_rollout_apps.commands.variant_flags import add_variant_flags, variant_fields


def add_parser(sub: argparse._SubParsersAction, presets: str) -> None:
    comp = sub.add_parser(
        "compare",
        help="SglangJaxRollout side by side with tunix's VanillaRollout (or VllmRollout on TPU)",
        description="Same weights, same prompts: greedy agreement, logprob fidelity against "
        "tunix's trainer at T 1 and 0.7, per-position TV distance of samples at T 1, "
        "throughput, and a short GRPO run with each. Writes compare.json and compare.png.",
    )
    comp.add_argument(
        "--against",
        choices=["vanilla", "vllm"],
        required=True,
        help="the tunix rollout to compare ours with: vanilla (tunix's VanillaRollout, "
        "anywhere) or vllm (VllmRollout, where vLLM-TPU is installed; exit 2 elsewhere) "
        "(required)",
    )
    comp.add_argument("--model-path", default=None, help="HF checkpoint dir (default: tiny)")
    comp.add_argument("--preset", default=None, help=f"slice preset from tpu_configs ({presets})")
    comp.add_argument("--out", default="compare_out", help="directory for the report")
    comp.add_argument("--steps", type=int, default=5, help="GRPO steps per rollout (>= 1)")
    comp.add_argument("--seed", type=int, default=0, help="seeds the prompts and the sampling")
    add_variant_flags(comp)
    comp.set_defaults(func=_compare)


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
            grpo_variant=variant_fields(args),
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
