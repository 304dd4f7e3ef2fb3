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
episodes that can start before it are those of batches already queued.

The preference comes back one level down, where blocking is safe: `yield_to_waiting_sync`,
called by an episode's model call (on the orchestrator's executor threads, never on its loop)
before the episode's first turn, lets a waiting sync go first. The sync then waits only for the
model calls already sampling, and the episodes that yielded sample under the new weights, as
tunix's lock would have started them."""

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

    def yield_to_waiting_sync(self) -> bool:
        """Where a weight sync waits, gives this episode's place up to it and takes it back once
        the sync has run; returns whether it yielded. Call it from a thread other than the event
        loop's (it blocks while the sync runs), holding the place `acquire_rollout` gave."""
        with self._changed:
            if not self.syncs_waiting:
                return False
            if self._rollouts < 1:
                raise RuntimeError("yield_to_waiting_sync without a rollout holding the lock")
            self._rollouts -= 1
            self._changed.notify_all()
            self._changed.wait_for(lambda: not self._syncing and not self.syncs_waiting)
            self._rollouts += 1
            return True

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
