"""Reward and rollout-entropy curves of training runs in one PNG (the demo's and compare's).

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for name, history in histories.items():
        steps = [r["step"] for r in history]
        top.plot(steps, [r["reward_mean"] for r in history], marker="o", label=name)
        bottom.plot(steps, [r.get("entropy_mean", math.nan) for r in history], marker="o")
    top.set_ylabel("reward mean")
    top.set_title(title)
    if len(histories) > 1:
        top.legend()
    bottom.set_ylabel("rollout entropy mean")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
