"""`sgl-jax-rollout bench replay`: what routing replay does for a MoE, and what it costs.

Owns `run`. On the Qwen3-MoE replica (`--like qwen3-30b-a3b`: 128 experts, top-8; bfloat16
weights; `LAYERS` deep; built in the cache on first use unless `model_dir` is given) the
engine samples in bfloat16 with `return_routed_experts`, and tunix's trainer scores the
completions in float32 twice: routing itself, then replaying the rollout's experts
(`tunix_adapter.routing_replay`). Reported per mode: mean and max |rollout logprob - trainer
logprob| over the completion tokens, and per layer the share of input positions (prompt and
completion) whose experts differ between the rollout and what the trainer used. `ok` holds
where replay makes the trainer's routing the rollout's on every position and cuts the mean gap
by at least `MEAN_GAP_CUT_TARGET`. The cost: decode tokens/s of the same calls with the engine
returning routed experts and without (two engines, one after the other, `runs` timed calls
each after a warm-up), and their ratio.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout.rollout_inputs import right_pad_ids

SETTINGS = dict(
    context_length=512,
    max_running_requests=16,
    precompile_bs_paddings=(16,),
    precompile_token_paddings=(2048,),
    max_prefill_tokens=2048,
    max_total_tokens=8192,
)
PROMPTS, TOKENS = 16, 64
# Deeper than the tests' replica (2): a flip changes the hidden state every later layer routes
# from, so flips compound with depth as they do over Qwen3-30B-A3B's 48 layers.
LAYERS = 4
MEAN_GAP_CUT_TARGET = 5.0


def _model_dir() -> Path:
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from sgl_jax_rollout.tiny_model.builder import MOE_EXPERTS, MOE_TOP_K, TinyShape, cached_dir

    return cached_dir(
        f"qwen3-30b-a3b-{MOE_EXPERTS}x{MOE_TOP_K}-{LAYERS}layers-bf16-seed0",
        lambda out: make_tiny_model(out, like="qwen3-30b-a3b", shape=TinyShape(layers=LAYERS)),
    )


def _config(seed: int = 0):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    return RolloutConfig(
        max_tokens_to_generate=TOKENS,
        max_prompt_length=256,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        seed=seed,
        return_logprobs=True,
    )


def _prompts() -> list[str]:
    return [f"question {i}: " + "the cat sat on the mat " * (3 + i) for i in range(PROMPTS)]


def _fidelity(rollout, model_dir: Path) -> dict[str, Any]:
    import jax.numpy as jnp

    from tunix_adapter import routing_replay
    from tunix_adapter.models import load_tunix_model

    trainer = load_tunix_model(model_dir)  # float32
    routing_replay.enable(trainer)
    out = rollout.generate(_prompts(), _config())
    pad = rollout.pad_id()
    prompts = np.asarray(out.left_padded_prompt_tokens)
    completions = right_pad_ids(out.tokens, TOKENS, pad)
    mask = completions != pad
    sampled = np.zeros(completions.shape, np.float32)
    for i, logprobs in enumerate(out.logprobs):
        sampled[i, : len(logprobs)] = logprobs
    routing = routing_replay.input_routing(out, prompts.shape[1], TOKENS)
    positions = routing[..., 0, 0] >= 0
    rows = {}
    for mode, experts in (("own_routing", None), ("replay", routing)):
        logps, used = routing_replay.routing_and_logps(
            trainer,
            jnp.asarray(prompts),
            jnp.asarray(completions),
            None if experts is None else jnp.asarray(experts),
            pad_id=pad,
            eos_id=rollout.eos_id(),
            temperature=1.0,
        )
        gap = np.abs(np.asarray(logps) - sampled)[mask]
        mismatch = routing_replay.mismatch_frac(routing, np.asarray(used), positions)
        rows[mode] = {
            "logprob_gap_mean": float(gap.mean()),
            "logprob_gap_max": float(gap.max()),
            "routing_mismatch_frac": [float(m) for m in mismatch],
        }
    rows["mean_gap_cut"] = rows["own_routing"]["logprob_gap_mean"] / max(
        rows["replay"]["logprob_gap_mean"], 1e-12
    )
    rows["max_gap_cut"] = rows["own_routing"]["logprob_gap_max"] / max(
        rows["replay"]["logprob_gap_max"], 1e-12
    )
    rows["completion_tokens"] = int(mask.sum())
    return rows


def _tokens_per_s(
    model_dir: Path, routed: bool, runs: int, fidelity: bool = True
) -> tuple[float, Any]:
    from sgl_jax_rollout.engine.settings import EngineSettings
    from sgl_jax_rollout.rollout import SglangJaxRollout

    settings = EngineSettings(**SETTINGS, return_routed_experts=routed)
    rollout = SglangJaxRollout(model_path=model_dir, engine_settings=settings)
    try:
        rollout.generate(_prompts(), _config())  # warm-up
        tokens, seconds = 0, 0.0
        for run in range(runs):
            start = time.perf_counter()
            out = rollout.generate(_prompts(), _config(seed=run + 1))
            seconds += time.perf_counter() - start
            tokens += sum(len(t) for t in out.tokens)
        extra = _fidelity(rollout, model_dir) if routed and fidelity else None
    finally:
        rollout.shutdown()
    return tokens / seconds, extra


def cost(runs: int = 5) -> dict[str, Any]:
    """The cost alone, on the replica: `bench rollout`'s routed-experts column."""
    model_dir = _model_dir()
    off, _ = _tokens_per_s(model_dir, routed=False, runs=runs)
    on, _ = _tokens_per_s(model_dir, routed=True, runs=runs, fidelity=False)
    return {
        "model": str(model_dir),
        "workload": f"{PROMPTS} x {TOKENS}",
        "tokens_per_s_routed_experts_off": off,
        "tokens_per_s_routed_experts_on": on,
        "routed_experts_cost_pct": 100.0 * (1.0 - on / off),
    }


def run(model_dir: str | Path | None = None, runs: int = 5) -> dict[str, Any]:
    """The fidelity rows and the cost (see the module docstring), as one JSON object."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    model_dir = Path(model_dir) if model_dir else _model_dir()
    off, _ = _tokens_per_s(model_dir, routed=False, runs=runs)
    on, fidelity = _tokens_per_s(model_dir, routed=True, runs=runs)
    replayed = fidelity["replay"]["routing_mismatch_frac"]
    return {
        "model": str(model_dir),
        "engine_dtype": "bfloat16 (the checkpoint's)",
        "trainer_dtype": "float32",
        "layers": LAYERS,
        "prompts": PROMPTS,
        "max_tokens": TOKENS,
        **fidelity,
        "tokens_per_s_routed_experts_off": off,
        "tokens_per_s_routed_experts_on": on,
        "routed_experts_cost_pct": 100.0 * (1.0 - on / off),
        "ok": all(m == 0.0 for m in replayed) and fidelity["mean_gap_cut"] >= MEAN_GAP_CUT_TARGET,
    }
