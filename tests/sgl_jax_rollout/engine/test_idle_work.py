"""IdleWork: functions submitted by callers run on the (simulated) scheduler thread, in order."""

import select
import threading

import pytest

from sgl_jax_rollout.engine.idle_work import IdleWork


def test_submitted_work_runs_on_the_idle_thread_in_order_and_wakes_it():
    work = IdleWork()
    ran = []
    stop = threading.Event()

    def scheduler_loop():  # plays the idle scheduler: waits on the pipe, then runs the work
        while not stop.is_set():
            select.select([work.fileno()], [], [], 0.05)
            work.run_pending("scheduler")

    thread = threading.Thread(target=scheduler_loop)
    thread.start()
    try:
        first = work.submit(lambda s: ran.append((1, s, threading.current_thread())) or "a")
        second = work.submit(lambda s: ran.append((2, s, threading.current_thread())) or "b")
        assert (first.result(timeout=5), second.result(timeout=5)) == ("a", "b")
        assert [(i, s) for i, s, _ in ran] == [(1, "scheduler"), (2, "scheduler")]
        assert all(t is thread for _, _, t in ran)
        failing = work.submit(lambda s: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(timeout=5)
        assert work.submit(lambda s: "still serving").result(timeout=5) == "still serving"
    finally:
        stop.set()
        thread.join()
        work.close()


def test_close_fails_work_never_run_and_refuses_new_work():
    work = IdleWork()
    pending = work.submit(lambda s: "never")
    cancelled = work.submit(lambda s: "never")
    assert cancelled.cancel()
    work.close()
    with pytest.raises(RuntimeError, match="shut down"):
        pending.result(timeout=0)
    with pytest.raises(RuntimeError, match="shut down"):
        work.submit(lambda s: None)
