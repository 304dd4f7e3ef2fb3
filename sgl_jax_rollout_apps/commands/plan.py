"""`sgl-jax-rollout plan`: the memory plan of a run before it starts.

Owns the subparser and the handler, which calls `tunix_adapter.memory_plan.plan` and prints
its table (or JSON); exit 1 when the run fits the chip in none of the ways.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def add_parser(sub: argparse._SubParsersAction, presets: str) -> None:
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
