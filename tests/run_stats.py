"""Where a test run's time goes: engine starts and XLA compiles, counted in every process.

Owns `RunStats` and its listeners on JAX's monitoring events: engine starts (the engine's
`ENGINE_START_EVENT`), backend compiles (programs and seconds, those loaded from the persistent
compilation cache among them), cache hits and misses, tracing and lowering seconds. The pytest
process keeps its own counts; a test's subprocess (a worker run as `python -m tests....`, which
imports this package) appends its counts to the file named by `STATS_FILE_VAR` when it exits,
and conftest.py prints the sum at the end of the run. Where `TIMES_FILE_VAR` names a file, each
test's seconds go to it as the test ends (`record_test`): a run stopped before its summary
(CI's time limit) still says where its time went.

Must not import the project's packages at module level beyond the light `utils.compiles`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import threading
import time
from pathlib import Path

from sgl_jax_rollout.utils.compiles import (
    BACKEND_COMPILE_EVENT,
    CACHE_HIT_EVENT,
    CACHE_MISS_EVENT,
    ENGINE_START_EVENT,
)

STATS_FILE_VAR = "SGL_JAX_ROLLOUT_RUN_STATS"
TIMES_FILE_VAR = "SGL_JAX_ROLLOUT_TEST_TIMES"

_DURATIONS = {
    BACKEND_COMPILE_EVENT: "compile",
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read",
}
_EVENTS = {
    CACHE_HIT_EVENT: "cache_hits",
    CACHE_MISS_EVENT: "cache_misses",
}


@dataclasses.dataclass
class RunStats:
    engine_starts: int = 0
    engine_start_s: float = 0.0
    compiles: int = 0  # backend compiles, loads from the persistent cache included
    compile_s: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_read_s: float = 0.0
    trace_s: float = 0.0
    lower_s: float = 0.0
    processes: int = 1

    def add(self, other: RunStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def lines(self) -> list[str]:
        compiled = self.compile_s - self.cache_read_s
        return [
            f"engine starts: {self.engine_starts} ({self.engine_start_s:.0f} s), "
            f"in {self.processes} process(es)",
            f"XLA programs: {self.compiles} ({self.cache_misses} compiled and written to the "
            f"persistent cache, {self.cache_hits} read from it); backend compile "
            f"{compiled:.0f} s, cache reads {self.cache_read_s:.0f} s, tracing {self.trace_s:.0f} "
            f"s, lowering {self.lower_s:.0f} s",
        ]


_own = RunStats()
_lock = threading.Lock()


def _on_duration(event: str, duration: float, **_: object) -> None:
    with _lock:
        if event == ENGINE_START_EVENT:
            _own.engine_starts += 1
            _own.engine_start_s += duration
        elif event in _DURATIONS:
            name = _DURATIONS[event]
            if name == "compile":
                _own.compiles += 1
            setattr(_own, f"{name}_s", getattr(_own, f"{name}_s") + duration)


def _on_event(event: str, **_: object) -> None:
    if event in _EVENTS:
        with _lock:
            setattr(_own, _EVENTS[event], getattr(_own, _EVENTS[event]) + 1)


def listen() -> None:
    """Registers the listeners (again: tunix's `MetricsLogger.close` clears every listener of
    the process, tunix 0.1.7 `sft/metrics_logger.py:190`)."""
    import jax

    with contextlib.suppress(AssertionError, ValueError):
        jax.monitoring.unregister_event_duration_listener(_on_duration)
    with contextlib.suppress(AssertionError, ValueError):
        jax.monitoring.unregister_event_listener(_on_event)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)


def own() -> RunStats:
    return _own


def record_subprocess() -> None:
    """In a test's subprocess: count, and append the counts to the stats file at exit."""
    path = os.environ.get(STATS_FILE_VAR)
    if not path:
        return
    listen()
    atexit.register(_append, Path(path))


def _append(path: Path) -> None:
    with _lock, path.open("a") as out:
        out.write(json.dumps(dataclasses.asdict(_own)) + "\n")


def subprocess_totals(path: Path) -> RunStats:
    """The counts subprocesses appended to `path` (processes: how many wrote)."""
    total = RunStats(processes=0)
    if path.is_file():
        for line in path.read_text().splitlines():
            total.add(RunStats(**json.loads(line)))
    return total


_started = time.monotonic()
_test_s: dict[str, float] = {}


def record_test(report) -> None:
    """Adds a test phase's (setup, call, teardown) seconds; after the teardown appends one line
    to the `TIMES_FILE_VAR` file, when set: minutes since the run started, the test's seconds,
    the machine's memory in use (GB: total - available) and the test's id."""
    path = os.environ.get(TIMES_FILE_VAR)
    if not path:
        return
    seconds = _test_s.get(report.nodeid, 0.0) + report.duration
    if report.when != "teardown":
        _test_s[report.nodeid] = seconds
        return
    _test_s.pop(report.nodeid, None)
    with open(path, "a") as out:
        out.write(
            f"{(time.monotonic() - _started) / 60:.1f} {seconds:.1f} {_used_gb():.1f} "
            f"{report.nodeid}\n"
        )


def _used_gb() -> float:
    fields = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        return 0.0
    return (fields["MemTotal"] - fields["MemAvailable"]) / 2**20
