"""`demo`'s learner flags: DAPO's dynamic sampling and slime's partial rollouts
(`add_group_sampling_flags`), tunix's agentic learner (`add_agentic_flags`), and the
`DemoConfig` fields each set gives (`group_sampling_fields`, `agentic_fields`). Must not run
anything: `commands/demo.py` builds the subparser and the run."""

from __future__ import annotations

import argparse


def add_group_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """`demo`'s dynamic sampling and partial rollout flags (sglang_jax rollout only)."""
    parser.add_argument(
        "--filter-groups",
        choices=("verl", "slime"),
        help="grpo / egpo: DAPO's dynamic sampling, keep sampling until every group of the step "
        "has rewards that differ (verl: population std > 0; slime: unbiased std > 1e-6) "
        "(default: none, no filter)",
    )
    parser.add_argument(
        "--over-sampling-batch-size",
        type=int,
        help="grpo / egpo on the sglang_jax rollout: prompts sent per round (>= the step's); "
        "a round returns once the groups still needed are there and aborts the rest "
        "(default: none, the step's prompts, no early stop)",
    )
    parser.add_argument(
        "--filter-timing",
        choices=("slime", "after_stop"),
        default="slime",
        help="with --filter-groups and --over-sampling-batch-size: slime filters each group "
        "as it finishes and stops once enough passed; after_stop stops once enough finished, "
        "then filters them (default: slime)",
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


def add_agentic_flags(parser: argparse.ArgumentParser) -> None:
    """`demo`'s flags of tunix's agentic learner (`sgl_jax_rollout_apps.agentic_demo`)."""
    parser.add_argument(
        "--learner",
        choices=("default", "agentic"),
        default="default",
        help="agentic: tunix's AgenticGRPOLearner (grpo): episodes of one chat per model "
        "call, --max-concurrency at once, which the engine batches; or tunix's GRPO / PPO "
        "learners, one rollout call per batch (default: default)",
    )
    parser.add_argument(
        "--tools",
        choices=("calculator",),
        default=None,
        help="--learner agentic --task arithmetic: multi-turn episodes with tunix's ToolAgent "
        "and calculator tool; the reward is the final answer's, --max-tokens 48 a turn where "
        "not given; each step reports the share of episodes that call the tool (default: "
        "none, single-turn)",
    )
    parser.add_argument(
        "--off-policy-steps",
        type=int,
        default=0,
        help="--learner agentic: batches tunix's producer may sample ahead of the trainer "
        "(AgenticGRPOConfig.off_policy_steps)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=16,
        help="--learner agentic: episodes at once, AgenticGRPOConfig.max_concurrency (default: 16)",
    )


def agentic_fields(args: argparse.Namespace) -> dict:
    return {
        "learner": args.learner,
        "tools": args.tools,
        "off_policy_steps": args.off_policy_steps,
        "max_concurrency": args.max_concurrency,
    }


def group_sampling_fields(args: argparse.Namespace) -> dict:
    return {
        "filter_groups": args.filter_groups,
        "over_sampling_batch_size": args.over_sampling_batch_size,
        "filter_timing": args.filter_timing,
        "partial_rollout": args.partial_rollout,
        "mask_offpolicy_in_partial_rollout": args.mask_offpolicy_in_partial_rollout,
    }
