"""What the engine holds at a moment: `EngineLoad`, read by `read_load` from sgl-jax's
scheduler (its waiting queue, its running batch and its KV pool through
`Scheduler._get_token_info`, the figures upstream's `get_internal_state` reports,
`managers/scheduler.py:1468-1484` at cddbf6f1) and from our call gate, without stopping the
engine: a snapshot, read from another thread while the scheduler runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    waiting_requests: int  # queued in the scheduler, not yet admitted into the running batch
    running_requests: int  # in the running batch
    kv_used_tokens: int  # KV slots held (by requests, and by the prefix cache where not evictable)
    kv_capacity_tokens: int
    serving_calls: int  # `generate` / `score` calls in the engine
    waiting_calls: int  # calls (and swaps, releases) waiting at the call gate

    @property
    def kv_used_fraction(self) -> float:
        return self.kv_used_tokens / self.kv_capacity_tokens if self.kv_capacity_tokens else 0.0


def read_load(scheduler: Any, gate: Any) -> EngineLoad:
    """`scheduler`: the running engine's (`upstream.scheduler_of`); `gate`: its `CallGate`."""
    if scheduler is None:
        raise RuntimeError("the engine is not running (shut down, or never started)")
    running = scheduler.running_batch
    used, _, _, _ = scheduler._get_token_info()
    return EngineLoad(
        waiting_requests=len(scheduler.waiting_queue),
        running_requests=0 if running is None or running.is_empty() else running.batch_size(),
        kv_used_tokens=int(used),
        kv_capacity_tokens=int(scheduler.max_total_num_tokens),
        serving_calls=gate.serving_calls(),
        waiting_calls=gate.waiting(),
    )
