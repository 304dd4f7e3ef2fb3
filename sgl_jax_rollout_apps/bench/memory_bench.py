"""`sgl-jax-rollout bench memory`: what releasing the engine's memory frees, costs and keeps.

Owns `run`: for the built-in tiny model and (with `real_size_layers` > 0) a model of
Qwen3-0.6B's dimensions and vocabulary with that many layers (generated offline, as `bench
rollout`'s), one engine each, in turn:

- `live_bytes` of the process's device arrays before a release, after it, after the resume
  (`engine.memory.live_bytes`; on accelerators also `memory_stats()` of the first device),
  with the KV pool only and with the weights too; `kv_left_frac` / `weights_left_frac`: what
  stays of each (the target: <= 0.05);
- `release_s`, `resume_s` against one `update_params` of the same weights (`update_s`), each
  the median of `runs`;
- `same_tokens`, `max_logprob_diff`: a seeded `generate` before the release and after the
  resume (after the weights' resume, once `update_params` brought them back);
- `sync_peak_over_steady_bytes`: at the weight sync after a release with weights (`update_params`
  resuming the engine), the most live bytes over the steady state, against the memory plan's
  figure (`plan_sync_peak_over_steady_bytes`: the weights over the KV pool, or 0; `plan`);
- `cycles` release / resume / generate rounds: `live_bytes` after the first and after the
  last (`leak_bytes`), and the compiles they made (`compiles`, target 0).

`ok` is false when a target is missed. The engine's settings are `bench rollout`'s for its
second model size (8 requests, a KV pool of 8,192 tokens).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

PROMPTS = ["the quick brown fox jumps over", "a long way from home, said the", "one two three"]
TARGET_LEFT_FRAC = 0.05
MAX_LOGPROB_DIFF = 1e-6


def run(
    model_dir: str | None = None, runs: int = 5, cycles: int = 20, real_size_layers: int = 2
) -> dict[str, Any]:
    from sgl_jax_rollout.tiny_model import default_model_dir, real_size_model_dir

    if runs < 1 or cycles < 1:
        raise ValueError(f"runs and cycles must be >= 1, got {runs} and {cycles}")
    models = {"tiny": model_dir or str(default_model_dir())}
    if real_size_layers:
        models["real_size"] = str(real_size_model_dir(real_size_layers))
    result: dict[str, Any] = {"runs": runs, "cycles": cycles}
    for name, path in models.items():
        result[name] = measure(path, runs, cycles)
    result["ok"] = all(result[name]["ok"] for name in models)
    return result


def measure(model_dir: str, runs: int, cycles: int) -> dict[str, Any]:
    """One engine on `model_dir`: the figures of the module docstring."""
    from flax import nnx

    from sgl_jax_rollout.engine.memory import live_bytes, live_bytes_at_resume
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.utils.compiles import count_compiles
    from sgl_jax_rollout_apps.bench.columns import rollout_config
    from sgl_jax_rollout_apps.bench.rollout_bench import REAL_SIZE_SETTINGS
    from tunix_adapter.models import load_tunix_model

    rollout = SglangJaxRollout(model_path=model_dir, engine_settings=REAL_SIZE_SETTINGS)
    config = rollout_config(max_tokens_to_generate=16, seed=[11, 12, 13], return_logprobs=True)
    weights = nnx.state(load_tunix_model(model_dir), nnx.Param)
    try:
        reference = rollout.generate(PROMPTS, config)
        rollout.update_params(weights)  # warm the update program
        out: dict[str, Any] = {"model": model_dir}
        held = live_bytes()
        times: dict[str, list[float]] = {"release_s": [], "resume_s": [], "update_s": []}
        for _ in range(runs):
            started = time.perf_counter()
            freed = rollout.release_memory()
            released = live_bytes()
            times["release_s"].append(time.perf_counter() - started)
            started = time.perf_counter()
            rollout.resume_memory()
            times["resume_s"].append(time.perf_counter() - started)
            started = time.perf_counter()
            rollout.update_params(weights)
            times["update_s"].append(time.perf_counter() - started)
        out.update({k: statistics.median(v) for k, v in times.items()})
        out["kv_bytes"] = freed["kv_bytes"]
        out["live_bytes"] = {"before": held, "released_kv": released, "resumed": live_bytes()}
        out["kv_left_frac"] = (released - (held - freed["kv_bytes"])) / freed["kv_bytes"]
        out.update(_compare(reference, rollout.generate(PROMPTS, config), "kv"))

        steady = live_bytes()
        freed = rollout.release_memory(weights=True, resume_on_use=True)
        out["live_bytes"]["released_kv_and_weights"] = live_bytes()
        out["weight_bytes"] = freed["weight_bytes"]
        left = live_bytes() - (held - freed["kv_bytes"] - freed["weight_bytes"])
        out["weights_left_frac"] = left / (freed["kv_bytes"] + freed["weight_bytes"])
        with live_bytes_at_resume(rollout.engine) as peaks:
            rollout.update_params(weights)  # the weight sync after a trainer update
        out["sync_peak_over_steady_bytes"] = max(peaks) - steady
        out["plan_sync_peak_over_steady_bytes"] = max(0, freed["weight_bytes"] - freed["kv_bytes"])
        out.update(_compare(reference, rollout.generate(PROMPTS, config), "weights"))

        first = None
        with count_compiles() as compiles:
            for _ in range(cycles):
                with rollout.released_memory():
                    pass
                rollout.generate(PROMPTS, config)
                first = first if first is not None else live_bytes()
        out["compiles"] = compiles.count
        out["leak_bytes"] = live_bytes() - first
        out["memory_stats"] = _memory_stats()
        out["ok"] = bool(
            out["kv_left_frac"] <= TARGET_LEFT_FRAC
            and out["weights_left_frac"] <= TARGET_LEFT_FRAC
            and out["kv_same_tokens"]
            and out["weights_same_tokens"]
            and out["kv_max_logprob_diff"] <= MAX_LOGPROB_DIFF
            and out["weights_max_logprob_diff"] <= MAX_LOGPROB_DIFF
            and out["compiles"] == 0
            and out["leak_bytes"] <= 0
            and out["sync_peak_over_steady_bytes"] <= out["plan_sync_peak_over_steady_bytes"]
        )
        return out
    finally:
        rollout.shutdown()


def _compare(reference: Any, again: Any, prefix: str) -> dict[str, Any]:
    same = all(np.array_equal(a, b) for a, b in zip(reference.tokens, again.tokens, strict=True))
    diff = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max()) if same else float("inf")
        for a, b in zip(reference.logprobs, again.logprobs, strict=True)
    )
    return {f"{prefix}_same_tokens": same, f"{prefix}_max_logprob_diff": diff}


def _memory_stats() -> dict[str, int] | None:
    """The first device's allocator statistics where the platform keeps them (not on CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats()
    return None if stats is None else {k: int(v) for k, v in stats.items() if "bytes" in k}
