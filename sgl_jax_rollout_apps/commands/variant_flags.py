"""The GRPO / EGPO variant flags that `demo` and `compare` share.

Owns `add_variant_flags` (the flags: off-policy correction, forking tokens, routing replay) and
`variant_fields` (the `DemoConfig` fields they set); each subcommand builds its own config.
"""

from __future__ import annotations

import argparse


def add_variant_flags(parser: argparse.ArgumentParser) -> None:
    """The GRPO / EGPO variant flags shared by `demo` and `compare`."""
    from tunix_adapter.off_policy import LEVELS, MODES, REJECTIONS

    parser.add_argument(
        "--is-correction",
        choices=[f"{level}-{mode}" for level in LEVELS for mode in MODES],
        default=None,
        help="grpo / egpo: old policy = trainer, off-policy correction of the rollout mismatch "
        "(verl rollout_is level and mode, TRL vllm_importance_sampling_mode) (default: none, the "
        "rollout's logprobs are the old policy)",
    )
    parser.add_argument(
        "--is-threshold",
        type=float,
        default=None,
        help="upper bound of the ratio, >= 1 (default: 2)",
    )
    parser.add_argument(
        "--is-threshold-lower",
        type=float,
        default=None,
        help="mask corrections: lower bound of the ratio, in [0, 1] (default: 1 / upper)",
    )
    parser.add_argument(
        "--is-rejection",
        choices=REJECTIONS,
        default=None,
        help="mask corrections: a rejected token gets weight 0 and stays in the loss's "
        "denominator and KL term (zero_weight: TRL, IcePop), or leaves the completion mask "
        "(response_mask: verl) (default: zero_weight)",
    )
    parser.add_argument(
        "--top-entropy-quantile",
        type=float,
        default=None,
        help="grpo / egpo: only the batch's top-rho tokens by rollout entropy (forking "
        "tokens) carry the policy gradient; rho in (0, 1] (default: none, every token)",
    )
    parser.add_argument(
        "--routing-replay",
        action="store_true",
        help="grpo / egpo on a MoE (Qwen3-MoE): the trainer routes every token to the experts "
        "the rollout routed it to (R3; the engine returns them)",
    )


def variant_fields(args: argparse.Namespace) -> dict:
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
