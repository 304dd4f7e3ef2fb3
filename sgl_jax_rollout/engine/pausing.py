"""Generation paused in place: the requests keep their KV cache and their place in the
running batch, no step runs, and they continue where they were at resume.

Owns `InPlacePause`, behind `RolloutEngine.pause`, `resume` and `paused`: upstream's
`pause_generation(mode="in_place")` and `continue_generation` (`TokenizerManager`,
`managers/tokenizer_manager.py:761-778`; `Scheduler`, `managers/scheduler.py:2859-2911`, at
cddbf6f1), sent on the engine's own event loop (`EngineProcess.on_engine_loop`). `pause`
returns once the scheduler has taken the pause in, so no step starts after it. While paused
the scheduler still takes in aborts, and waits on its sockets instead of spinning
(`patches` paused_waits); a request sent meanwhile waits in the tokenizer manager until
`resume`.

Weight swaps and memory release and resume wait for the running calls to end, which a pause
holds: they refuse while paused (`not_paused`), a pause asked while one of them waits or runs
takes effect after it, and a pause of released memory refuses. Must not serve requests or
touch weights.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sgl_jax_rollout.engine import upstream

logger = logging.getLogger(__name__)

PAUSE_POLL_S = 0.002  # how often `pause` and `resume` look at the scheduler's state


class InPlacePause:
    def __init__(self, process: Any, released: Callable[[], bool], wait_s: float) -> None:
        """`released`: whether the engine's memory is released (`MemoryLifecycle`)."""
        self._process = process  # an EngineProcess
        self._released = released
        self._wait_s = wait_s
        self._lock = threading.Lock()  # held by pause, resume and the jobs that refuse a pause
        self.paused = False

    def pause(self) -> None:
        """Pauses generation in place (does nothing when paused already)."""
        with self._lock:
            if self.paused:
                return
            if self._released():  # a call resuming it would wait for the calls paused
                raise RuntimeError(
                    "pause: the engine's memory is released (release_memory): nothing runs "
                    "to pause; call resume_memory first"
                )
            self._send(upstream.get("PauseGenerationReqInput")(mode="in_place"), "pause")
            self.paused = True
            logger.info("generation paused in place")

    def resume(self) -> None:
        """Continues the paused requests (does nothing when not paused)."""
        with self._lock:
            if not self.paused:
                return
            if self._process.hooks.ended.done():  # shut down: nothing is left to continue
                self.paused = False
                return
            self._send(upstream.get("ContinueGenerationReqInput")(), "resume")
            self.paused = False
            logger.info("generation resumed")

    @contextlib.contextmanager
    def not_paused(self, job: str) -> Iterator[None]:
        """Runs `job`'s block with generation running, no pause taking effect until it ends;
        RuntimeError naming `job` when paused."""
        with self._lock:
            if self.paused:
                raise RuntimeError(
                    f"{job}: generation is paused in place (RolloutEngine.pause), and {job} "
                    "waits for the running calls to end, which the pause holds; call "
                    "RolloutEngine.resume first"
                )
            yield

    def _send(self, request: Any, what: str) -> None:
        process = self._process
        process.check_open()
        manager = process.engine.tokenizer_manager
        method = manager.pause_generation if what == "pause" else manager.continue_generation

        async def send() -> None:
            await method(request)

        process.on_engine_loop(send)
        want = what == "pause"
        deadline = time.monotonic() + self._wait_s
        while process.scheduler._engine_paused is not want:
            process.check_open()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the engine's scheduler did not take the {what} in within {self._wait_s:.0f}s"
                )
            time.sleep(PAUSE_POLL_S)
