"""Reward and rollout-entropy curves of training runs in one PNG (demo, compare, sweep).

Owns the applications' only matplotlib use. matplotlib comes with the `apps` extra
(`pip install "sgl-jax-rollout[apps]"`); `require_matplotlib` says so before a run starts.
"""

from __future__ import annotations

import math
from pathlib import Path


def require_matplotlib() -> None:
    """Raises ImportError naming the `apps` extra when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'plots need matplotlib, part of the `apps` extra: pip install "sgl-jax-rollout[apps]"'
        ) from err


def reward_and_entropy(histories: dict[str, list[dict]], path: Path, title: str) -> None:
    """Two stacked panels over the step: reward mean, rollout entropy mean (NaN where a run
    has none); one line per named history, with a legend when there are several."""
    seed_bands({name: [history] for name, history in histories.items()}, path, title)


def seed_bands(runs: dict[str, list[list[dict]]], path: Path, title: str) -> None:
    """Like `reward_and_entropy`, for several seeds per named run: the mean over seeds, shaded
    between the lowest and the highest seed at each step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for name, histories in runs.items():
        steps = [r["step"] for r in histories[0]]
        for axis, key in ((top, "reward_mean"), (bottom, "entropy_mean")):
            values = np.array([[r.get(key, math.nan) for r in h] for h in histories])
            (line,) = axis.plot(steps, values.mean(0), marker="o", label=name)
            if len(histories) > 1:
                axis.fill_between(
                    steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.2
                )
    top.set_ylabel("reward mean")
    top.set_title(title)
    if len(runs) > 1:
        top.legend()
    bottom.set_ylabel("rollout entropy mean")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
