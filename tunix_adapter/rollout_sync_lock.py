"""A rollouts-or-weight-sync lock for tunix's agentic learner that never stalls its event loop.

tunix's `RolloutSyncLock` (`tunix/rl/agentic/utils.py:219-264` at 0.1.7 and main) holds new
rollouts back as soon as a weight sync *waits* for the lock. Its orchestrator takes that lock
with a blocking call inside each episode's coroutine (`pipeline/rollout_orchestrator.py:164`),
on the one thread that runs every episode's event loop. So when the trainer asks to sync while
episodes run (with `off_policy_steps` >= 1 the producer samples the next batch meanwhile) and
one more episode starts, that episode blocks the loop: the running episodes can never finish,
the sync waits for them forever, and `train()` hangs.

`LoopSafeRolloutSyncLock` keeps the lock's guarantee (no episode runs while weights sync; a
sync waits for the episodes running) and drops only the preference: a new episode waits for a
sync that runs, which needs no episode to finish, never for one that waits. The waiting sync is
not starved: the learner queues the next batch's prompts only while it holds the sync, so the
episodes that can start before it are those of batches already queued."""

from __future__ import annotations

import threading


class LoopSafeRolloutSyncLock:
    """Many episodes at once, or one weight sync; the interface of tunix's `RolloutSyncLock`
    (`acquire_rollout` / `release_rollout` from the orchestrator, `acquire_weight_sync` /
    `release_weight_sync` from the learner). `syncs_waiting` counts syncs waiting for
    episodes to finish."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._rollouts = 0
        self._syncing = False
        self.syncs_waiting = 0

    def acquire_rollout(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: not self._syncing)
            self._rollouts += 1

    def release_rollout(self) -> None:
        with self._changed:
            if self._rollouts < 1:
                raise RuntimeError("release_rollout without a rollout holding the lock")
            self._rollouts -= 1
            self._changed.notify_all()

    def acquire_weight_sync(self) -> None:
        with self._changed:
            self.syncs_waiting += 1
            try:
                self._changed.wait_for(lambda: not self._syncing and not self._rollouts)
            finally:
                self.syncs_waiting -= 1
            self._syncing = True

    def release_weight_sync(self) -> None:
        with self._changed:
            if not self._syncing:
                raise RuntimeError("release_weight_sync without a weight sync holding the lock")
            self._syncing = False
            self._changed.notify_all()
