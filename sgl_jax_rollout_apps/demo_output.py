"""What a demo run reports: the line of each step and the files in `--out DIR`.

Owns `REPORTED` (the short names of the metrics a step reports; `AGENTIC_REPORTED`, where
tunix's agentic learner logs them under other names), `step_line` (the line printed
under the progress bar: reward mean, completion length, rollout entropy mean, trainer/rollout
logprob difference), `output_dir` (`--out`, or a process's own folder in it) and
`write_outputs`: `metrics.jsonl` (one line per step: every metric the learner and tunix log that
step, under its own name, and the short names of `REPORTED`) and `metrics.png` (reward, rollout
entropy and the trainer/rollout logprob mismatch over steps). Must not read tunix's metrics
(`demo.train` does) or decide what is run.
"""

from __future__ import annotations

import json
from pathlib import Path

from sgl_jax_rollout_apps.demo_config import DemoConfig
from sgl_jax_rollout_apps.demo_prompts import share
from sgl_jax_rollout_apps.plotting import training_curves

REPORTED = {
    "reward_mean": "rewards/score/mean",
    "completion_length": "completions/mean_length",
    "entropy_mean": "rollout/entropy_mean",
    "logp_diff_mean": "rollout/trainer_logp_abs_diff_mean",
    "logp_diff_max": "rollout/trainer_logp_abs_diff_max",
    "zero_variance_group_frac": "rewards/zero_variance_group_frac",
    "forking_kept_frac": "rollout/forking_kept_token_frac",
    "is_weight_mean": "off_policy/weight_mean",
    "memory_released_bytes": "rollout/memory_released_bytes",
}
# tunix's agentic learner logs these under its own names (`agentic_grpo_learner.py`)
AGENTIC_REPORTED = {
    "completion_length": "generation/completions/mean_length",
    "logp_diff_mean": "sampler_trainer/logp_diff_mean",
    "logp_diff_max": "sampler_trainer/logp_diff_max",
    "tool_call_frac": "tools/call_frac",
}


def output_dir(config: DemoConfig) -> Path:
    """`--out`, or with one process per host `--out/process-<i>`: every process reports the
    metrics of its own share of the batch (tunix computes them per process)."""
    index, count = share(config)
    return Path(config.out) / f"process-{index}" if count > 1 else Path(config.out)


def step_line(row: dict[str, float]) -> str:
    parts = [f"step {row['step']:3d}", f"reward {row['reward_mean']:.3f}"]
    if "completion_length" in row:
        parts.append(f"len {row['completion_length']:.1f}")
    if "entropy_mean" in row:
        parts.append(f"entropy {row['entropy_mean']:.3f}")
    if "logp_diff_mean" in row:
        parts.append(f"|logp trainer-rollout| mean {row['logp_diff_mean']:.2e}")
        parts.append(f"max {row['logp_diff_max']:.2e}")
    if "tool_call_frac" in row:
        parts.append(f"tool calls {row['tool_call_frac']:.2f}")
    if row.get("memory_released_bytes"):
        parts.append(f"released {row['memory_released_bytes'] / 2**20:.1f} MiB")
    return "  ".join(parts)


def write_outputs(history: list[dict[str, float]], out: Path, config: DemoConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "w") as f:
        for row in history:
            f.write(json.dumps({**row, "algo": config.algo, "rollout": config.rollout}) + "\n")
    training_curves(
        {config.rollout: history},
        out / "metrics.png",
        f"{config.algo.upper()} with the {config.rollout} rollout",
    )
