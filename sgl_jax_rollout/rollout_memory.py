"""The rollout's memory hand-off to the trainer: `release_memory`, `resume_memory` and
`released_memory` of `SglangJaxRollout`, translated onto the engine's
(`engine.memory_lifecycle`).

Owns the translation of a release's options (a `restore` in tunix's layout, split into base
weights and LoRA factors as `update_params` splits them) and of its byte counts. Must not hold
any state of its own: the engine keeps what is released and when it comes back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from sgl_jax_rollout.engine.lora import split_update


class RolloutMemory:
    """Memory release for a rollout whose engine is `self._engine` and whose trainer-side
    actor (for LoRA layouts) is `self._actor`."""

    _engine: Any
    _actor: Any

    def release_memory(
        self,
        weights: bool = False,
        resume_on_use: bool = False,
        restore: Callable[[], Any] | None = None,
    ) -> dict[str, int]:
        """Frees the engine's KV pool on the devices (and with `weights` its parameters) while
        the trainer runs; waits for a running call first. Returns the bytes freed
        (`{"kv_bytes": ..., "weight_bytes": ...}`). Until `resume_memory`, `generate`, scoring
        and sessions raise RuntimeError naming the release (`engine.memory`); with
        `resume_on_use` the first of them (or `update_params`) resumes first instead. With
        weights released, such a call needs `restore` (weights and resume_on_use only): it
        returns the state to serve again, as `update_params` takes it (the one last passed
        there: the policy version stays); without it the call raises until `update_params`."""
        back = None if restore is None else (lambda: split_update(restore(), self._actor))
        released = self._engine.release_memory(weights, resume_on_use, back)
        return {"kv_bytes": released.kv_bytes, "weight_bytes": released.weight_bytes}

    def resume_memory(self) -> None:
        """Brings the KV pool back, empty (the prefix cache was flushed), with the same shapes
        and shardings: nothing recompiles. After `release_memory(weights=True)` the next
        `update_params` must come before any `generate` (which raises until then)."""
        self._engine.resume_memory()

    @contextlib.contextmanager
    def released_memory(self, weights: bool = False):
        """`with rollout.released_memory(): train()`: released inside, resumed on the way out
        (also when the block raises). Yields `release_memory`'s byte counts."""
        freed = self.release_memory(weights)
        try:
            yield freed
        finally:
            self.resume_memory()
