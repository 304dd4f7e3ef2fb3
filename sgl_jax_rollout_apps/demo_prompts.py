"""The toy task's prompts, and each JAX process's share of a step's prompts.

Owns `prompts` (the toy task: "Tell me about the <subject>:"), `local_prompts` (this
process's share of step `step`'s) and `share` (which share, and the check that the prompts
divide evenly over the processes).
"""

from __future__ import annotations

import numpy as np

from sgl_jax_rollout_apps.demo_config import DemoConfig

_SUBJECTS = [
    "water",
    "time",
    "people",
    "number",
    "answer",
    "word",
    "place",
    "day",
    "work",
    "tool",
    "search",
    "plan",
    "result",
    "man",
    "sum",
    "step",
    "call",
    "way",
    "part",
]


def prompts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"Tell me about the {rng.choice(_SUBJECTS)}:" for _ in range(count)]


def local_prompts(config: DemoConfig, step: int) -> list[str]:
    """This process's share of step `step`'s prompts: all of them in one process; with one
    process per host, process p's consecutive share (tunix assembles the trainer's batch from
    every process's share, in process order)."""
    index, count = share(config)
    rows = config.prompts_per_step // count
    return prompts(config.prompts_per_step, config.seed * 100_003 + step)[index * rows :][:rows]


def share(config: DemoConfig) -> tuple[int, int]:
    """(this process's index, process count); ValueError unless the prompts divide evenly."""
    from sgl_jax_rollout.engine.hosts import process_share

    index, count = process_share()
    if config.prompts_per_step % count:
        raise ValueError(
            f"prompts_per_step ({config.prompts_per_step}) must be a multiple of the JAX "
            f"process count ({count}): every host samples an equal share"
        )
    return index, count
