"""Fault containment: no fault on an engine thread takes the trainer's process down
(docs/design.md section 8; catalog: `patches/__init__.py`).

Owns `install` for `step_guard`, `contained_signals` and `watchdog`.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.patches.hooks import (
    batch_requests,
    current,
    fail_requests,
    logger,
    wrap,
)


def install() -> None:
    get = upstream.get
    for path in upstream.SIGNALLING_MODULES:
        module = upstream.module(path)
        if not isinstance(module.psutil, _ContainedPsutil):
            module.psutil = _ContainedPsutil()
    wrap(get("Scheduler"), "run_batch", _step_guard)
    wrap(get("Scheduler"), "watchdog_thread", _watchdog)


def _step_guard(original, self, batch, *args, **kwargs):
    """step_guard: a step that raises on the scheduler thread (our row building, the
    forward without overlap; a failing sampler is handled in `sample_with_slot_state`)
    fails exactly its requests: they are aborted with the error as message, and the step is
    run again with neutral greedy rows (the precompiled sampler) so that upstream finishes
    them and frees their cache as for any abort. If that run raises too, the engine cannot
    go on: the exception reaches upstream's loop handler, whose SIGQUIT `contained_signals`
    turns into an engine fault."""
    hooks = current()
    if hooks is None or hooks.neutral_rows:
        return original(self, batch, *args, **kwargs)
    try:
        return original(self, batch, *args, **kwargs)
    except Exception as err:
        fail_requests(self, batch_requests(batch), hooks, "an engine step", err)
    hooks.neutral_rows = True
    try:
        return original(self, batch, *args, **kwargs)
    finally:
        hooks.neutral_rows = False


def _watchdog(original, self):
    """watchdog: replaces `Scheduler.watchdog_thread` (not called): the same rule, no step
    finished for `watchdog_timeout` seconds while a batch is current, ends the engine with a
    fault. Upstream's loop never exits (it keeps every shut-down scheduler alive) and then
    SIGQUITs `psutil.Process().parent()`, in single-process mode the process that started
    the trainer."""
    del original
    hooks = self._sgl_jax_rollout_hooks
    if hooks is None:
        return
    timeout = float(self.server_args.watchdog_timeout)
    last_count, last_time = -1, time.perf_counter()
    while not hooks.stop.wait(min(timeout / 4, 5.0)):
        now = time.perf_counter()
        count = getattr(self, "forward_ct", 0)
        if getattr(self, "cur_batch", None) is None or count != last_count:
            last_count, last_time = count, now
        elif now - last_time > timeout:
            hooks.fault(f"no engine step finished in {timeout:.0f}s (watchdog_timeout)")
            return


class _ContainedPsutil:
    """contained_signals: `psutil` as sgl-jax's scheduler, detokenizer and model worker modules
    see it. Their thread handlers end every exception with `Process().send_signal(SIGQUIT)` to
    this process (whose handler upstream kills the whole process tree) or to its parent; here
    that signal becomes a fault of the running engine instead, with the exception being
    handled as its cause. Other signals pass through."""

    def __getattr__(self, name: str) -> Any:
        import psutil

        return getattr(psutil, name)

    def Process(self, *args: Any, **kwargs: Any) -> _ContainedProcess:  # noqa: N802
        import psutil

        return _ContainedProcess(psutil.Process(*args, **kwargs))


class _ContainedProcess:
    def __init__(self, process: Any) -> None:
        self._process = process

    def __getattr__(self, name: str) -> Any:
        return getattr(self._process, name)

    def parent(self) -> _ContainedProcess | None:
        parent = self._process.parent()
        return None if parent is None else _ContainedProcess(parent)

    def send_signal(self, sig: int) -> None:
        if sig != signal.SIGQUIT:
            self._process.send_signal(sig)
            return
        error = sys.exc_info()[1]
        where = threading.current_thread().name
        reason = f"{where}: {type(error).__name__}: {error}" if error else f"{where} failed"
        hooks = current()
        if hooks is None:
            logger.error("an sgl-jax thread failed after its engine stopped: %s", reason)
            return
        hooks.fault(reason, error)
