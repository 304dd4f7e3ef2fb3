"""`sgl-jax-rollout bench start`: what the persistent compilation cache saves an engine start.

Owns `run`: engine starts of one model (default: the real checkpoint, SmolLM2-135M-Instruct,
built on first use) with `SETTINGS` (batch buckets 1, 4, 16; prefill buckets 256 and 1,024; a
KV pool of 8,192 tokens: the default 4,096-token bucket over a 32,768-token pool does not fit a
24 GiB CPU machine under the native attention), each in a process of its own so that nothing
compiled stays in memory between them, in turns of three:

- `cold`: a start with an empty compilation cache (it compiles every program and writes it);
- `warm`: a start with the cache the cold start filled (it reads every program);
- `no_cache`: a start with the cache off (it compiles every program, writes nothing).

Each start reports its wall time (`RolloutEngine`'s start: weights, KV pool, precompile) and
its programs compiled and read. `warm_over_cold` and `warm_over_no_cache` are ratios of
medians; `ok` is `warm_over_no_cache <= 1/3` (issue 58's target), with every warm start reading
its programs and compiling none.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TARGET_WARM_OVER_NO_CACHE = 1 / 3
SETTINGS = dict(
    max_running_requests=16,
    precompile_bs_paddings=(1, 4, 16),
    precompile_token_paddings=(256, 1024),
    max_prefill_tokens=1024,
    context_length=1024,
    max_total_tokens=8192,
)
CACHE_VARIABLES = (
    "SGL_JAX_ROLLOUT_COMPILATION_CACHE_DIR",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
)


def run(model_dir: str | None = None, runs: int = 5) -> dict[str, Any]:
    from sgl_jax_rollout_apps.real_model import real_model_dir

    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    model = model_dir or str(real_model_dir())
    starts: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": [], "no_cache": []}
    progress = _progress(3 * runs)
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="compile-cache-") as cache:
            starts["cold"].append(_start(model, cache))
            progress.update()
            starts["warm"].append(_start(model, cache))
            progress.update()
        starts["no_cache"].append(_start(model, None))
        progress.update()
    progress.close()
    median = {name: statistics.median(s["start_s"] for s in each) for name, each in starts.items()}
    result: dict[str, Any] = {
        "model": model,
        "runs": runs,
        "median_start_s": median,
        "warm_over_cold": median["warm"] / median["cold"],
        "warm_over_no_cache": median["warm"] / median["no_cache"],
        "starts": starts,
    }
    result["ok"] = result["warm_over_no_cache"] <= TARGET_WARM_OVER_NO_CACHE and all(
        s["compiled"] == 0 and s["read"] > 0 for s in starts["warm"]
    )
    return result


def _progress(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="engine starts", file=sys.stderr)


def _start(model: str, cache: str | None) -> dict[str, Any]:
    """One engine start in a new process: its `measure_start` JSON."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    command = [sys.executable, "-m", "sgl_jax_rollout_apps.bench.start_bench", model]
    done = subprocess.run(
        [*command, cache or ""], env=env, capture_output=True, text=True, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"an engine start failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_start(model: str, cache: str | None) -> dict[str, Any]:
    """Starts one engine on `model` (the compilation cache at `cache`, or off) and shuts it
    down: wall seconds of the start, programs compiled, programs read from the cache."""
    import time

    from sgl_jax_rollout.engine.engine import RolloutEngine
    from sgl_jax_rollout.engine.settings import EngineSettings
    from sgl_jax_rollout.utils.compiles import count_compiles

    settings = EngineSettings(**SETTINGS, compilation_cache_dir=cache or None)
    with count_compiles() as compiles:
        started = time.perf_counter()
        engine = RolloutEngine(Path(model), settings)
        start_s = time.perf_counter() - started
    engine.shutdown()
    compiled = compiles.cache_misses if cache else compiles.count  # no cache: all compiled
    return {
        "start_s": start_s,
        "programs": compiles.count,
        "compiled": compiled,
        "read": compiles.cache_hits,
    }


if __name__ == "__main__":
    print(json.dumps(measure_start(sys.argv[1], sys.argv[2] or None)))
