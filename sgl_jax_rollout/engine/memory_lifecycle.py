"""The engine's memory between calls: released, resumed, and checked before serving.

Owns `MemoryLifecycle`, the state behind `RolloutEngine.release_memory` / `resume_memory`:
what is released (`memory.Released`), whether the next call that needs the engine resumes
it (`resume_on_use`, with `restore` for released weights), and whether resumed weights are
still zero stand-ins (`weights_pending`); `check_serving` is what every serving call runs
first. The device work itself (deleting and re-making buffers) is `engine.memory`'s, run on
the idle scheduler thread (`EngineProcess.when_idle`).

Release, resume and `resume_with` run as the engine's exclusive job (`CallGate.exclusive`:
no call is running). `check_serving` runs in every serving call, several at once: the first
that finds a release with `resume_on_use` resumes it while the others wait (no request of
theirs is in the engine yet), then they find it resumed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sgl_jax_rollout.engine import memory
from sgl_jax_rollout.engine.call_gate import CallGate
from sgl_jax_rollout.engine.process import EngineProcess


class MemoryLifecycle:
    def __init__(self, process: EngineProcess, gate: CallGate) -> None:
        self._process = process
        self._gate = gate  # the engine's admission
        self._checking = threading.Lock()  # one serving call's `check_serving` at a time
        self.released: memory.Released | None = None  # set between release and resume
        self.resume_on_use = False  # the next call that needs the engine resumes it
        self.restore = None  # with resume_on_use: the weights a serving call resumes with
        self.weights_pending = False  # resumed without weights: update_weights comes first

    @property
    def weights_released(self) -> bool:
        return self.released is not None and self.released.weights is not None

    def release(
        self,
        weights: bool,
        resume_on_use: bool,
        restore: Callable[[], tuple[Any, Any]] | None,
    ) -> memory.Released:
        """`RolloutEngine.release_memory`."""
        if restore is not None and not (weights and resume_on_use):
            raise ValueError("release_memory: restore needs weights=True and resume_on_use=True")
        with self._gate.exclusive():
            self._process.check_open()
            if self.released is not None:
                raise RuntimeError("release_memory: the engine's memory is already released")
            self.released = self._process.when_idle(
                lambda scheduler: self._release(scheduler, weights)
            )
            self.resume_on_use = resume_on_use
            self.restore = restore
            return self.released

    def resume_memory(self) -> None:
        """`RolloutEngine.resume_memory`."""
        with self._gate.exclusive():
            self._process.check_open()
            self._resume()

    def _resume(self) -> None:
        """`resume_memory`, with no call running."""
        if self.released is None:
            return
        released = self.released
        self._process.when_idle(lambda scheduler: memory.resume(released))
        if released.weights is not None:
            self._swap_in_zeros(released)
            self.weights_pending = True
        self._resumed()

    def resume_with(self, params: Any, lora: Any) -> None:
        """Resumes serving `params` (no call running). The weights are mapped and swapped in before
        the KV pool comes back, so the peak is two copies of the weights (the old, or zero
        stand-ins for released ones, and the new) or the weights and the KV pool, never all
        three at once."""
        released, process = self.released, self._process
        if released.weights is not None:  # the mapping reads the leaves it replaces
            self._swap_in_zeros(released)
        leaves = process.weights.prepare(params, lora)
        process.when_idle(lambda scheduler: process.weights.swap(leaves))
        del leaves
        process.when_idle(lambda scheduler: memory.resume(released))
        self.weights_pending = False
        self._resumed()

    def _swap_in_zeros(self, released: memory.Released) -> None:
        """Zero stand-ins in the places of the released weights (same shapes and shardings)."""
        process = self._process
        zeros = process.when_idle(lambda scheduler: memory.zero_weights(released))
        process.when_idle(lambda scheduler: process.weights.swap(zeros))

    def _resumed(self) -> None:
        self.released = None
        self.resume_on_use = False
        self.restore = None

    def _release(self, scheduler: Any, weights: bool) -> memory.Released:
        flushed, message, _ = scheduler.flush_cache()
        if not flushed:  # cannot happen while fully idle; never keep prefixes of freed KV
            raise RuntimeError(f"release_memory: the prefix cache flush failed: {message}")
        # The sampler's per-slot state and the last rows on the device go too; the next step
        # makes them anew (no request runs: the scheduler is idle).
        hooks = self._process.hooks
        hooks.slot_state = hooks.placed_rows = hooks.decode_rows = None
        return memory.release(self._process.model_runner, weights)

    def check_serving(self, what: str) -> None:
        """Raises unless the engine can serve `what` now (in a serving call, before any of its
        requests is sent); a release with `resume_on_use` is resumed here instead."""
        with self._checking:
            self._check_serving(what)

    def _check_serving(self, what: str) -> None:
        self._process.check_open()
        if self.released is not None and self.resume_on_use:
            if self.released.weights is None:
                self._resume()
            elif self.restore is not None:
                self.resume_with(*self.restore())
            else:
                raise RuntimeError(
                    f"{what}: the engine's weights are released until the next update_params "
                    "(release_memory(weights=True) without restore=); call update_params first"
                )
        if self.released is not None:
            raise RuntimeError(
                f"{what}: the engine's memory is released (release_memory); call "
                "resume_memory() first"
            )
        if self.weights_pending:
            raise RuntimeError(
                f"{what}: the engine's weights were released and are not back yet; call "
                "update_params with the trainer's weights first"
            )
