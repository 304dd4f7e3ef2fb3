"""Weight swaps of the running engine, never under a running call.

Owns `WeightUpdates`, behind `RolloutEngine.update_weights`, `engine_state`, `version` and
`flush_prefix_cache` (the flush alone, the weights and their version kept):
the new weights are mapped and checked on the caller's thread
(`weights.WeightSwapper.prepare`), then swapped in together with a prefix-cache flush on the
idle scheduler thread, as the engine's exclusive job (`CallGate.exclusive`: the calls running
when it arrives finish first, calls arriving after it wait for it), so no step sees half of it
and no completion is sampled under two weight versions. `version` counts the swaps; a serving
call reads it once admitted, and it cannot change until that call returns. After a
`release_memory(resume_on_use=True)` the update is the resume (`MemoryLifecycle.resume_with`).
Must not map weights itself (`engine.weights` does).
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.engine.call_gate import CallGate
from sgl_jax_rollout.engine.memory_lifecycle import MemoryLifecycle
from sgl_jax_rollout.engine.process import EngineProcess


class WeightUpdates:
    def __init__(self, process: EngineProcess, memory: MemoryLifecycle, gate: CallGate) -> None:
        self._process = process
        self._memory = memory
        self._gate = gate  # the engine's admission
        self.version = 0  # weight swaps so far

    def engine_state(self):
        """`RolloutEngine.engine_state`."""
        self._process.check_open()
        if self._memory.weights_released:
            raise RuntimeError("engine_state: the engine's weights are released; resume first")
        return self._process.weights.engine_state()

    def update(self, params: Any, lora: Any) -> None:
        """`RolloutEngine.update_weights`."""
        with self._gate.exclusive():
            self._process.check_open()
            if self._memory.released is not None and self._memory.resume_on_use:
                self._memory.resume_with(params, lora)
                self.version += 1
                return
            if self._memory.weights_released:
                raise RuntimeError(
                    "update_params: the engine's weights are released (release_memory("
                    "weights=True)); call resume_memory() first, then update_params"
                )
            leaves = self._process.weights.prepare(params, lora)
            self._process.when_idle(lambda scheduler: self._swap_and_flush(scheduler, leaves))
            self._memory.weights_pending = False
            self.version += 1

    def flush(self) -> None:
        """`RolloutEngine.flush_prefix_cache`: the flush alone, as the engine's exclusive job."""
        with self._gate.exclusive():
            self._process.check_open()
            self._process.when_idle(_flush)

    def _swap_and_flush(self, scheduler: Any, leaves: list) -> None:
        self._process.weights.swap(leaves)
        _flush(scheduler)


def _flush(scheduler: Any) -> None:
    flushed, message, _ = scheduler.flush_cache()
    if not flushed:  # cannot happen while fully idle; never serve stale prefixes silently
        raise RuntimeError(f"prefix cache flush failed on the idle scheduler: {message}")
