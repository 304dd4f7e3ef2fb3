"""CallGate: serving calls of one mode run together, an exclusive job runs alone after the
calls admitted before it and before those that arrive after it, and nobody waiting starves.
(The engine side, 16 threads racing a weight sync: test_concurrency_engine.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from sgl_jax_rollout.engine.call_gate import SCORING_MODE, CallGate

WAIT_S = 5.0


class Holder:
    """A thread holding the gate (serving `mode`, or exclusive) until `release` is set."""

    def __init__(self, gate: CallGate, mode="a", exclusive: bool = False) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                with gate.exclusive() if exclusive else gate.serving(mode):
                    self.entered.set()
                    assert self.release.wait(WAIT_S)
            except BaseException as err:  # noqa: BLE001 - reported by `done`
                self.error = err

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def done(self) -> None:
        self.release.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive() and self.error is None


def settle() -> None:
    time.sleep(0.05)  # long enough for a thread that could enter to have entered


def test_serving_calls_of_one_mode_run_together_and_scoring_apart():
    gate = CallGate()
    calls = [Holder(gate, "a") for _ in range(4)]
    for call in calls:
        assert call.entered.wait(WAIT_S)
    assert gate.serving_calls() == 4
    scoring = Holder(gate, SCORING_MODE)
    settle()
    assert not scoring.entered.is_set()
    for call in calls:
        call.done()
    assert scoring.entered.wait(WAIT_S)
    more = [Holder(gate, SCORING_MODE) for _ in range(2)]
    for call in more:
        assert call.entered.wait(WAIT_S)
    for call in [scoring, *more]:
        call.done()
    assert gate.serving_calls() == 0


def test_a_call_of_another_mode_waits_for_the_running_mode_and_holds_back_later_calls():
    gate = CallGate()
    first = Holder(gate, "a")
    assert first.entered.wait(WAIT_S)
    other = Holder(gate, "b")
    settle()
    later = Holder(gate, "a")  # same mode as the running call, but behind "b" in line
    settle()
    assert not other.entered.is_set() and not later.entered.is_set()
    first.done()
    assert other.entered.wait(WAIT_S)
    settle()
    assert not later.entered.is_set()
    other.done()
    assert later.entered.wait(WAIT_S)
    later.done()


def test_an_exclusive_job_waits_for_running_calls_and_calls_after_it_wait_for_it():
    gate = CallGate()
    running = [Holder(gate) for _ in range(3)]
    for call in running:
        assert call.entered.wait(WAIT_S)
    sync = Holder(gate, exclusive=True)
    settle()
    arriving = Holder(gate)
    settle()
    assert not sync.entered.is_set() and not arriving.entered.is_set()
    for call in running:
        call.done()
    assert sync.entered.wait(WAIT_S)
    settle()
    assert not arriving.entered.is_set() and gate.serving_calls() == 0
    sync.done()
    assert arriving.entered.wait(WAIT_S)
    arriving.done()


def test_a_caller_interrupted_while_waiting_leaves_the_line():
    gate = CallGate()
    first = Holder(gate, "a")
    assert first.entered.wait(WAIT_S)
    entered = threading.Event()

    class Interrupt(Exception):
        pass

    def interrupted_wait(*args, **kwargs):
        raise Interrupt

    original = gate._cond.wait
    gate._cond.wait = interrupted_wait  # the waiting caller is interrupted (a signal, say)
    with pytest.raises(Interrupt), gate.serving("b"):
        entered.set()
    gate._cond.wait = original
    assert not entered.is_set()
    behind = Holder(gate, "a")  # not held back by the caller that left
    assert behind.entered.wait(WAIT_S)
    first.done()
    behind.done()
    with gate.exclusive():
        assert gate.serving_calls() == 0
