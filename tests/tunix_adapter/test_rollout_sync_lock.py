"""`LoopSafeRolloutSyncLock` taken as tunix's agentic learner takes its lock: episodes call
`acquire_rollout` blocking, inside coroutines on one event loop thread
(`rollout_orchestrator.py:164`), and the trainer's thread calls `acquire_weight_sync`. With
tunix's `RolloutSyncLock` the first test's second episode blocks the loop and nothing ends
(what hung `train()` with `off_policy_steps` 1)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tunix_adapter.rollout_sync_lock import LoopSafeRolloutSyncLock

WAIT_S = 10  # far above any wait here; a deadlock reads as a timeout


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT_S)
    loop.close()


def episode(lock, loop, started: threading.Event, proceed: threading.Event):
    async def run():
        lock.acquire_rollout()  # blocking, on the loop's thread, as tunix's orchestrator does
        try:
            started.set()
            await asyncio.get_running_loop().run_in_executor(None, proceed.wait)
        finally:
            lock.release_rollout()

    return asyncio.run_coroutine_threadsafe(run(), loop)


def until(condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_an_episode_starting_while_a_sync_waits_leaves_the_loop_running(loop):
    lock = LoopSafeRolloutSyncLock()
    first_started, first_may_end = threading.Event(), threading.Event()
    first = episode(lock, loop, first_started, first_may_end)
    assert first_started.wait(WAIT_S)

    synced = threading.Event()

    def sync():
        lock.acquire_weight_sync()
        synced.set()
        lock.release_weight_sync()

    trainer = threading.Thread(target=sync)
    trainer.start()
    until(lambda: lock.syncs_waiting == 1)

    at_once = threading.Event()
    at_once.set()
    episode(lock, loop, threading.Event(), at_once).result(WAIT_S)  # runs, though a sync waits
    assert not synced.is_set()  # the sync still waits for the first episode

    first_may_end.set()
    first.result(WAIT_S)
    trainer.join(WAIT_S)
    assert synced.is_set() and lock.syncs_waiting == 0


def test_episodes_wait_for_a_running_sync_and_a_sync_for_running_episodes(loop):
    lock = LoopSafeRolloutSyncLock()
    lock.acquire_weight_sync()
    started, at_once = threading.Event(), threading.Event()
    at_once.set()
    held_back = episode(lock, loop, started, at_once)
    assert not started.wait(0.2)  # no episode starts while weights sync
    lock.release_weight_sync()
    held_back.result(WAIT_S)

    running, may_end = threading.Event(), threading.Event()
    pending = episode(lock, loop, running, may_end)
    assert running.wait(WAIT_S)
    synced = threading.Event()
    trainer = threading.Thread(target=lambda: (lock.acquire_weight_sync(), synced.set()))
    trainer.start()
    until(lambda: lock.syncs_waiting == 1)
    assert not synced.is_set()
    may_end.set()
    pending.result(WAIT_S)
    trainer.join(WAIT_S)
    assert synced.is_set()
    lock.release_weight_sync()


def test_an_episode_yielding_before_its_first_turn_lets_a_waiting_sync_go_first(loop):
    lock = LoopSafeRolloutSyncLock()
    sampling, first_may_end = threading.Event(), threading.Event()
    first = episode(lock, loop, sampling, first_may_end)  # in its model call: the sync waits
    assert sampling.wait(WAIT_S)
    order = []

    def first_turn():  # the model call, on an executor thread as tunix runs it
        until(lambda: lock.syncs_waiting == 1)
        order.append(("yielded", lock.yield_to_waiting_sync()))
        order.append("second samples")

    async def second_episode():
        lock.acquire_rollout()
        try:
            await asyncio.get_running_loop().run_in_executor(None, first_turn)
        finally:
            lock.release_rollout()

    second = asyncio.run_coroutine_threadsafe(second_episode(), loop)

    def sync():
        lock.acquire_weight_sync()
        order.append("sync")
        lock.release_weight_sync()

    trainer = threading.Thread(target=sync, daemon=True)  # a failure leaves no thread waiting
    trainer.start()
    first_may_end.set()
    first.result(WAIT_S)
    second.result(WAIT_S)
    trainer.join(WAIT_S)
    assert order == ["sync", ("yielded", True), "second samples"]  # not waiting for the second
    assert not lock.yield_to_waiting_sync()  # no sync waits: nothing to yield to
    lock.acquire_weight_sync()  # every place was given back
    lock.release_weight_sync()


def test_a_release_without_its_acquire_is_refused_by_name():
    lock = LoopSafeRolloutSyncLock()
    with pytest.raises(RuntimeError, match="release_rollout"):
        lock.release_rollout()
    with pytest.raises(RuntimeError, match="release_weight_sync"):
        lock.release_weight_sync()
    lock.acquire_weight_sync()
    waiting = threading.Thread(target=lock.acquire_weight_sync, daemon=True)
    waiting.start()
    until(lambda: lock.syncs_waiting == 1)
    with pytest.raises(RuntimeError, match="yield_to_waiting_sync"):
        lock.yield_to_waiting_sync()  # no episode holds a place
