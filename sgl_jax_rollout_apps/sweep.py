"""`sgl-jax-rollout demo --sweep`: GRPO, GRPO on forking tokens and EGPO, side by side.

Owns `VARIANTS`, `run_sweep` and `summary`. Each variant trains the demo's task for the same
steps from the same seed (same prompts, same initial weights); with several seeds, each seed is
one more run of every variant. Writes `sweep.jsonl` (one line per variant, seed and step) and
`sweep.png` (reward and rollout entropy over the steps: the mean over seeds, shaded from the
lowest to the highest seed) under `out`. One engine per process: each run shuts its engine
down before the next one builds its own.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from sgl_jax_rollout_apps import demo
from sgl_jax_rollout_apps.plotting import require_matplotlib, seed_bands


def variants(rho: float) -> dict[str, dict]:
    """Name -> the `DemoConfig` fields that make the variant."""
    return {
        "grpo": {"algo": "grpo"},
        f"grpo forking (rho={rho:g})": {"algo": "grpo", "top_entropy_quantile": rho},
        "egpo": {"algo": "egpo"},
    }


def run_sweep(
    base: demo.DemoConfig, seeds: list[int], rho: float = 0.2
) -> dict[str, list[list[dict]]]:
    """{variant: [history of each seed]}; writes the outputs when `base.out` is set."""
    if not seeds:
        raise ValueError("the sweep needs at least one seed")
    if base.out:
        require_matplotlib()
    runs: dict[str, list[list[dict]]] = {}
    for name, fields in variants(rho).items():
        for seed in seeds:
            config = dataclasses.replace(base, out=None, seed=seed, **fields)
            runs.setdefault(name, []).append(demo.run(config))
    if base.out:
        write_outputs(runs, seeds, Path(base.out), base)
    return runs


def summary(runs: dict[str, list[list[dict]]], last: int = 5) -> dict[str, dict[str, float]]:
    """Per variant: mean reward of the first and the last `last` steps, over seeds (and the
    spread of the last-steps figure across seeds), and the last-steps rollout entropy."""
    out = {}
    for name, histories in runs.items():
        late = [np.mean([r["reward_mean"] for r in h[-last:]]) for h in histories]
        early = [np.mean([r["reward_mean"] for r in h[:last]]) for h in histories]
        entropy = [np.mean([r.get("entropy_mean", np.nan) for r in h[-last:]]) for h in histories]
        out[name] = {
            "reward_first_steps": float(np.mean(early)),
            "reward_last_steps": float(np.mean(late)),
            "reward_last_steps_seed_min": float(np.min(late)),
            "reward_last_steps_seed_max": float(np.max(late)),
            "entropy_last_steps": float(np.mean(entropy)),
        }
    return out


def write_outputs(runs, seeds: list[int], out: Path, base: demo.DemoConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep.jsonl", "w") as f:
        for name, histories in runs.items():
            for seed, history in zip(seeds, histories, strict=True):
                for row in history:
                    f.write(json.dumps({**row, "variant": name, "seed": seed}) + "\n")
    seed_bands(
        runs,
        out / "sweep.png",
        f"{base.steps} steps, seeds {', '.join(map(str, seeds))} ({base.rollout} rollout)",
    )
