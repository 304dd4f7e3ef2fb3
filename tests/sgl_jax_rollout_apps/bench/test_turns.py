"""`turns.Turns`: columns timed in rotated turns, medians per column (test doubles stand in
for the worker processes: the test is about the order of the turns and the arithmetic)."""

from __future__ import annotations

import pytest

from sgl_jax_rollout_apps.bench.turns import Turns


class FakeWorker:
    """Answers from a table (label, workload) -> list of answers, one per ask, and logs the
    order it was asked in."""

    def __init__(self, answers: dict, log: list, host_labels=()):
        self.labels = sorted({label for label, _ in answers})
        self.host_labels = list(host_labels)
        self._answers = {key: list(values) for key, values in answers.items()}
        self._log = log

    def ask(self, command: dict):
        key = (command["label"], command["workload"])
        self._log.append((command["op"], *key))
        return self._answers[key].pop(0)


def turns_of(workers: dict, workloads: dict) -> Turns:
    turns = Turns.__new__(Turns)
    turns.workloads = workloads
    turns._workers = workers
    return turns


def test_each_run_times_every_column_once_in_an_order_rotated_from_run_to_run():
    log: list = []
    workloads = {"w": (2, (5, 5), 10), "v": (1, (5, 5), 4)}  # 20 and 4 tokens a call
    a = FakeWorker(
        {
            ("a_full", "w"): [1.0, 2.0, 4.0],
            ("a_plain", "w"): [1.0, 1.0, 1.0],
            ("a_full", "v"): [1.0, 1.0, 1.0],
            ("a_plain", "v"): [2.0, 2.0, 2.0],
        },
        log,
    )
    b = FakeWorker({("b", "w"): [10.0, 5.0, 5.0], ("b", "v"): [0.5, 0.5, 8.0]}, log)
    rates = turns_of({"a": a, "b": b}, workloads).rates(3)
    assert rates == {
        "w": {
            "a_full": pytest.approx(10.0),
            "a_plain": pytest.approx(20.0),
            "b": pytest.approx(4.0),
        },
        "v": {"a_full": pytest.approx(4.0), "a_plain": pytest.approx(2.0), "b": pytest.approx(8.0)},
    }
    order = [(label, workload) for _, label, workload in log]
    assert order == [
        *[("a_full", "w"), ("a_plain", "w"), ("b", "w")],
        *[("a_full", "v"), ("a_plain", "v"), ("b", "v")],
        *[("a_plain", "w"), ("b", "w"), ("a_full", "w")],
        *[("a_plain", "v"), ("b", "v"), ("a_full", "v")],
        *[("b", "w"), ("a_full", "w"), ("a_plain", "w")],
        *[("b", "v"), ("a_full", "v"), ("a_plain", "v")],
    ]


def test_host_time_is_the_median_of_each_figure_over_the_runs_of_the_columns_that_have_it():
    log: list = []
    samples = [
        {"host_ms_per_decode_step": 3.0, "steps": 64},
        {"host_ms_per_decode_step": 1.0, "steps": 64},
        {"host_ms_per_decode_step": 2.0, "steps": 65},
    ]
    with_runner = FakeWorker({("x", "w"): samples}, log, host_labels=["x"])
    without = FakeWorker({("y", "w"): []}, log)
    host = turns_of({"x": with_runner, "y": without}, {"w": (1, (5, 5), 4)}).host(3)
    assert host == {"w": {"x": {"host_ms_per_decode_step": 2.0, "steps": 64}}}
    assert log == [("host", "x", "w")] * 3
