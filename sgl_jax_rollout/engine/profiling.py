"""Where the engine's wall time goes: time spent in jitted model and sampler calls, per step.

Owns `time_jitted_calls(model_runner)`, a context manager for benchmarks only, and
`host_time`, the median split of a call's time per step over several runs. It wraps the
*instance* attributes `forward` and `sample` of one sgl-jax `ModelRunner` (upstream
`ModelRunner.forward` / `ModelRunner.sample`, commit in `availability.PINNED_COMMIT`), blocks on
their outputs so their device time is counted, and restores them on exit. With overlap
scheduling off (always, here) the scheduler waits for each step's tokens anyway, so blocking
inside the timer moves no work out of the measured window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax


@dataclasses.dataclass
class JitTimes:
    model_s: float = 0.0
    sampler_s: float = 0.0
    steps: int = 0
    decode_steps: int = 0

    @property
    def jitted_s(self) -> float:
        return self.model_s + self.sampler_s


@contextlib.contextmanager
def time_jitted_calls(model_runner: Any) -> Iterator[JitTimes]:
    times = JitTimes()
    forward, sample = model_runner.forward, model_runner.sample

    def timed_forward(forward_batch, *args, **kwargs):
        start = time.perf_counter()
        out = jax.block_until_ready(forward(forward_batch, *args, **kwargs))
        times.model_s += time.perf_counter() - start
        times.steps += 1
        times.decode_steps += int(forward_batch.forward_mode.is_decode())
        return out

    def timed_sample(*args, **kwargs):
        start = time.perf_counter()
        out = jax.block_until_ready(sample(*args, **kwargs))
        times.sampler_s += time.perf_counter() - start
        return out

    model_runner.forward, model_runner.sample = timed_forward, timed_sample
    try:
        yield times
    finally:
        del model_runner.forward, model_runner.sample


def host_time(model_runner: Any, call: Callable[[], Any], runs: int) -> dict[str, float]:
    """Per model step, the median over `runs` timed calls of `call`: host milliseconds (wall
    minus the jitted model and sampler calls), sampler and model milliseconds; and the steps
    of one call."""
    samples = []
    for _ in range(runs):
        with time_jitted_calls(model_runner) as times:
            start = time.perf_counter()
            call()
            wall = time.perf_counter() - start
        samples.append(
            {
                "host_ms_per_decode_step": 1e3 * (wall - times.jitted_s) / times.steps,
                "sampler_ms_per_step": 1e3 * times.sampler_s / times.steps,
                "model_ms_per_step": 1e3 * times.model_s / times.steps,
                "steps": times.steps,
            }
        )
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}
