"""Counting XLA compilations with JAX's own monitoring events.

Owns `count_compiles`, used by tests and benchmarks to prove that changing per-request
settings never recompiles (it counts every backend compile in the process while active), and
the name of the event the engine records its start under (`ENGINE_START_EVENT`, a duration in
seconds, for any listener registered with `jax.monitoring`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import jax

# The event jax records once per backend (XLA) compilation.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# The event `RolloutEngine` records once it has started (loading, precompile and all).
ENGINE_START_EVENT = "/sgl_jax_rollout/engine/start_duration"


# The events JAX records when the persistent compilation cache has (or lacks) a program.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"


@dataclasses.dataclass
class CompileCount:
    count: int = 0  # backend compiles, programs read from the persistent cache included
    seconds: float = 0.0
    cache_hits: int = 0  # programs read from the persistent compilation cache
    cache_misses: int = 0  # programs compiled with the cache on (and written to it)


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileCount]:
    """Counts backend compilations (and their seconds) made inside the block, and the
    persistent compilation cache's hits and misses among them."""
    result = CompileCount()
    lock = threading.Lock()

    def on_duration(event: str, duration: float, **_: object) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with lock:
                result.count += 1
                result.seconds += duration

    def on_event(event: str, **_: object) -> None:
        if event in (CACHE_HIT_EVENT, CACHE_MISS_EVENT):
            with lock:
                if event == CACHE_HIT_EVENT:
                    result.cache_hits += 1
                else:
                    result.cache_misses += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    try:
        yield result
    finally:
        # tunix's `MetricsLogger.close` (which a cluster's close calls) clears every listener
        # of the process (tunix 0.1.7 `sft/metrics_logger.py:190`): ours may be gone already.
        with contextlib.suppress(AssertionError, ValueError):
            jax.monitoring.unregister_event_duration_listener(on_duration)
        with contextlib.suppress(AssertionError, ValueError):
            jax.monitoring.unregister_event_listener(on_event)
