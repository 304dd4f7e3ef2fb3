"""Reward, rollout-entropy and trainer/rollout mismatch curves of training runs in one PNG
(demo, compare, sweep), and
a task run's held-out accuracy, reward and step time per rollout (`demo --task`).

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


def training_curves(histories: dict[str, list[dict]], path: Path, title: str) -> None:
    """Three stacked panels over the step: reward mean, rollout entropy mean, and the mean
    |trainer - rollout| logprob of the sampled tokens (NaN where a run has none); one line per
    named history, with a legend when there are several."""
    seed_bands({name: [history] for name, history in histories.items()}, path, title)


def seed_bands(runs: dict[str, list[list[dict]]], path: Path, title: str) -> None:
    """Like `training_curves`, for several seeds per named run: the mean over seeds, shaded
    between the lowest and the highest seed at each step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    panels = ((top, "reward_mean"), (middle, "entropy_mean"), (bottom, "logp_diff_mean"))
    for name, histories in runs.items():
        steps = [r["step"] for r in histories[0]]
        for axis, key in panels:
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
    middle.set_ylabel("rollout entropy mean")
    bottom.set_ylabel("|logp trainer - rollout| mean")
    _whole_steps(bottom)
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def task_curves(runs: dict[str, tuple[list[dict], list[dict]]], path: Path, title: str) -> None:
    """Three stacked panels over the step, one line per rollout: held-out greedy accuracy (from
    each run's evaluations), reward mean and wall time per step (from its history rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (accuracy, reward, seconds) = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    for name, (history, evals) in runs.items():
        accuracy.plot([e["step"] for e in evals], [e["accuracy"] for e in evals], "o-", label=name)
        steps = [r["step"] for r in history]
        reward.plot(steps, [r.get("reward_mean", math.nan) for r in history], label=name)
        seconds.plot(steps, [r.get("step_seconds", math.nan) for r in history], label=name)
    accuracy.set_ylabel("held-out greedy accuracy")
    accuracy.set_title(title)
    accuracy.legend()
    reward.set_ylabel("reward mean")
    seconds.set_ylabel("wall time per step (s)")
    seconds.set_yscale("log")
    _whole_steps(seconds)
    seconds.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _whole_steps(axis) -> None:
    """Step ticks at whole steps only (a short run otherwise gets 0.5, 1.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
