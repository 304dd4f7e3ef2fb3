"""`sgl-jax-rollout check`: the pre-flight, trainer and engine on the same checkpoint.

Owns the subparser and the handler, which runs `tunix_adapter.check` with the engine settings
the flags give and prints its table; exit 1 when a check fails, 2 without the engine.
"""

from __future__ import annotations

import argparse
import sys

from sgl_jax_rollout_apps.commands.engine import engine_missing


def add_parser(sub: argparse._SubParsersAction, presets: str) -> None:
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
        "trainer scores prompts x samples rows at once, or in chunks whose float32 logits fit "
        "1 GiB)",
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
        help="what serves the CPU / GPU attention: paged, ours, or upstream, sgl-jax's own "
        "(page size 1 only on CPU) (default: paged)",
    )
    chk.add_argument(
        "--rope-phases",
        choices=["trainer", "sgl-jax"],
        default=None,
        help="how the engine rounds its RoPE phases: trainer, as tunix's model of the "
        "checkpoint does (where tunix has one), or sgl-jax, upstream's (default: trainer)",
    )
    chk.add_argument(
        "--numerics",
        choices=["trainer", "sgl-jax"],
        default=None,
        help="how a bfloat16 engine rounds its norms, attention, RoPE and MoE router: trainer, "
        "as tunix's model of the checkpoint does (Qwen2 / 3, Qwen3-MoE, Llama, Gemma 2 / 3 / 4; "
        "engine/numerics.py lists each op), or sgl-jax, upstream's (default: trainer)",
    )
    chk.add_argument(
        "--trainer-dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="the dtype tunix's trainer computes in, its weights cast to it (default: the "
        "engine's)",
    )
    chk.add_argument(
        "--trainer-logits-dtype",
        choices=["float32"],
        default=None,
        help="float32: the trainer's logits cast to float32 as they leave tunix's model, as "
        "tunix main does (tunix 0.1.7's Llama 3 / Gemma 2 / 3 return them in the compute "
        "dtype and temper them there); twice the logits' memory (default: tunix's model's)",
    )
    chk.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    if engine_missing():
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
        trainer_dtype=args.trainer_dtype,
        trainer_logits_dtype=args.trainer_logits_dtype,
        engine_settings={
            name: value
            for name, value in (
                ("dtype", args.dtype),
                ("page_size", args.page_size),
                ("native_attention", args.native_attention),
                ("rope_phases", args.rope_phases),
                ("numerics", args.numerics),
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
