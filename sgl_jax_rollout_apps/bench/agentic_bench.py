"""`sgl-jax-rollout bench agentic`: tunix's agentic GRPO steps with our rollout against tunix's
`VanillaRollout`, under the same learner and config.

Owns `run` and `measure`. Each variant is a `demo --learner agentic` run (`demo.build`,
`demo.train`) on the demo's toy task: `PROMPTS` prompts x `GENERATIONS` single-turn episodes a step,
up to `tokens` tokens each (`TOKENS` by default), `max_concurrency` 16 (tunix's `AgenticGRPOConfig`
default), both rollouts seeded per call (`tunix_adapter.agentic.AgenticModelCall`). Variants: each
rollout with `off_policy_steps` 0 and 1, taken in turns (ours, vanilla, ours, vanilla), one model
after the other. A step's time is the time between the ends of two successive actor updates (the
trainer's step, which the producer's episodes feed; with `off_policy_steps` 1 the next batch's
episodes are sampled during it); the first `WARMUP` steps compile and are not timed. Reported per
variant: the median step, steps/s, every step's time and the mean episode length over the timed
steps (episodes may stop before `tokens`); `ratios`: vanilla's median step over ours at each
`off_policy_steps` (above 1: ours is faster) and ours at 1 over ours at 0 (below 1: running ahead
pays). The built-in model, and the Qwen3-0.6B-size model (`real_size_model_dir`, few layers) unless
`real_size_layers` is 0. `ok`: on the last model, ours at least `SPEEDUP_TARGET` x faster than
vanilla at `off_policy_steps` 0, and ours at 1 no slower than at 0 (`NO_SLOWER` tolerance).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS, GENERATIONS, TOKENS = 8, 2, 16  # 16 episodes a step: max_concurrency's default
MAX_TOKENS = 1024  # an episode's longest (`--tokens`)
MAX_CONCURRENCY = 16
WARMUP, STEPS = 2, 4
REAL_SIZE_LAYERS = 2
SPEEDUP_TARGET = 2.0  # issue 80: ours at least 2x vanilla's steps/s at max_concurrency 16
NO_SLOWER = 1.05  # off_policy_steps 1 within 5% of 0 counts as no slower
ROLLOUTS = ("sglang_jax", "vanilla")
OFF_POLICY_STEPS = (0, 1)


def check_tokens(tokens: int) -> None:
    """ValueError naming `--tokens` and its range unless `tokens` is an episode's length here."""
    if not 1 <= tokens <= MAX_TOKENS:
        raise ValueError(f"--tokens must be in [1, {MAX_TOKENS}], got {tokens}")


def _variant(model_dir: Path, rollout: str, off_policy_steps: int, steps: int, tokens: int) -> dict:
    """One agentic run of `WARMUP + steps + 1` updates: its step times after the warm-up."""
    from sgl_jax_rollout_apps import demo
    from sgl_jax_rollout_apps.demo_config import DemoConfig

    config = DemoConfig(
        rollout=rollout,
        learner="agentic",
        off_policy_steps=off_policy_steps,
        max_concurrency=MAX_CONCURRENCY,
        model_path=str(model_dir),
        steps=WARMUP + steps + 1,
        prompts_per_step=PROMPTS,
        num_generations=GENERATIONS,
        max_tokens=tokens,
        show_progress=False,
    )
    cluster, learner = demo.build(config)
    ends: list[float] = []
    update = cluster.update_actor

    def timed_update(*args: Any, **kwargs: Any) -> Any:
        out = update(*args, **kwargs)
        ends.append(time.perf_counter())
        return out

    cluster.update_actor = timed_update
    with contextlib.redirect_stdout(sys.stderr):  # the demo's step lines; stdout is the JSON
        history = demo.train(config, cluster, learner)
    times = [b - a for a, b in zip(ends[WARMUP:], ends[WARMUP + 1 :], strict=False)]
    median = statistics.median(times)
    return {
        "rollout": rollout,
        "off_policy_steps": off_policy_steps,
        "step_s_median": round(median, 3),
        "steps_per_s": round(1 / median, 3),
        "step_s": [round(t, 3) for t in times],
        "episode_tokens_mean": round(
            statistics.mean(row["completion_length"] for row in history[WARMUP:]), 2
        ),
        "reward_mean_last": round(history[-1]["reward_mean"], 4),
    }


def measure(model_dir: Path, steps: int = STEPS, tokens: int = TOKENS) -> dict[str, Any]:
    """Every variant on `model_dir`, in turns; their ratios."""
    variants = {}
    for off_policy_steps in OFF_POLICY_STEPS:
        for rollout in ROLLOUTS:
            name = (
                f"{'ours' if rollout == 'sglang_jax' else 'vanilla'}_off_policy_{off_policy_steps}"
            )
            variants[name] = _variant(model_dir, rollout, off_policy_steps, steps, tokens)
    step = {name: v["step_s_median"] for name, v in variants.items()}
    ratios = {
        f"vanilla_over_ours_off_policy_{k}": round(
            step[f"vanilla_off_policy_{k}"] / step[f"ours_off_policy_{k}"], 3
        )
        for k in OFF_POLICY_STEPS
    }
    ratios["ours_off_policy_1_over_0"] = round(
        step["ours_off_policy_1"] / step["ours_off_policy_0"], 3
    )
    return {"model": str(model_dir), "variants": variants, "ratios": ratios}


def run(
    model_dir: str | Path | None = None,
    steps: int | None = None,
    real_size_layers: int = REAL_SIZE_LAYERS,
    tokens: int = TOKENS,
) -> dict[str, Any]:
    """`measure` on the built-in model (or `model_dir`), then on the Qwen3-0.6B-size model,
    episodes of up to `tokens` tokens."""
    from sgl_jax_rollout.tiny_model import default_model_dir, real_size_model_dir

    steps = STEPS if steps is None else steps
    if steps < 3:
        raise ValueError(f"steps must be >= 3 (timed agentic steps), got {steps}")
    check_tokens(tokens)
    models = {"built_in": Path(model_dir) if model_dir else default_model_dir()}
    if real_size_layers:
        models["real_size"] = real_size_model_dir(real_size_layers)
    results = {name: measure(path, steps, tokens) for name, path in models.items()}
    last = results[list(models)[-1]]["ratios"]
    return {
        "workload": {
            "prompts_per_step": PROMPTS,
            "episodes_per_prompt": GENERATIONS,
            "tokens_per_episode": tokens,
            "max_concurrency": MAX_CONCURRENCY,
            "warmup_steps": WARMUP,
            "timed_steps": steps,
        },
        "models": results,
        "speedup_target": SPEEDUP_TARGET,
        "ok": last["vanilla_over_ours_off_policy_0"] >= SPEEDUP_TARGET
        and last["ours_off_policy_1_over_0"] <= NO_SLOWER,
    }
