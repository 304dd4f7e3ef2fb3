"""Work run on the engine's scheduler thread while it is fully idle.

Owns `IdleWork`: a caller thread `submit`s a function and gets a `Future`; the scheduler
thread runs it (`run_pending`, called by the `idle_wait_and_stop` patch) only when no
request is waiting, running or half-processed, so the function may change scheduler state
(swap weights, flush the prefix cache) without racing a step. A pipe wakes the idle
scheduler at once (it waits on its sockets and on `fileno()`), so a submission costs two
thread hand-offs instead of a request round trip through sgl-jax's tokenizer manager.

No sgl_jax import: the functions receive the scheduler object and read what they need.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class IdleWork:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[Any], Any], Future]] = queue.SimpleQueue()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._closed = False

    def fileno(self) -> int:
        """The descriptor the idle scheduler waits on (readable when work was submitted)."""
        return self._read_fd

    def submit(self, fn: Callable[[Any], Any]) -> Future:
        if self._closed:
            raise RuntimeError("the rollout engine was shut down")
        future: Future = Future()
        self._queue.put((fn, future))
        os.write(self._write_fd, b"\0")
        return future

    def run_pending(self, scheduler: Any) -> None:
        """Scheduler thread, fully idle: runs every submitted function, in order."""
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                fn, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(scheduler))
            except BaseException as err:  # handed to the caller; the scheduler keeps running
                future.set_exception(err)

    def close(self) -> None:
        """Fails whatever was never run and releases the pipe (after the scheduler stopped)."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                _, future = self._queue.get_nowait()
            except queue.Empty:
                break
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("the rollout engine was shut down"))
        os.close(self._read_fd)
        os.close(self._write_fd)
