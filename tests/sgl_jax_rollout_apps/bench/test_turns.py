"""`turns`: columns timed in rotated turns, runs spread over engine starts, medians per column
(test doubles stand in for the worker processes: the test is about the order of the turns,
the spread over starts and the arithmetic)."""

from __future__ import annotations

import pytest

from sgl_jax_rollout_apps.bench import turns as turns_module
from sgl_jax_rollout_apps.bench.turns import Turns, measure


class FakeWorker:
    """Answers from a table (label, workload) -> answers, one per ask in order, and logs
    the order it was asked in."""

    def __init__(self, answers: dict, log: list, host_labels=()):
        self.labels = sorted({label for label, _ in answers})
        self.host_labels = list(host_labels)
        self._answers = answers
        self._log = log

    def ask(self, command: dict):
        if command["op"] == "check":
            return f"checked {command['name']}"
        key = (command["label"], command["workload"])
        self._log.append((command["op"], *key))
        return self._answers[key].pop(0)

    def close(self):
        pass


def turns_of(workers: dict, workloads: dict) -> Turns:
    turns = Turns.__new__(Turns)
    turns.workloads = workloads
    turns._workers = workers
    return turns


def test_each_round_times_every_column_once_in_an_order_rotated_from_round_to_round():
    log: list = []
    workloads = {"w": (2, (5, 5), 10), "v": (1, (5, 5), 4)}
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
    seconds = turns_of({"a": a, "b": b}, workloads).rounds("time", 2, first_round=1)
    assert seconds == {
        "w": {"a_full": [1.0, 2.0], "a_plain": [1.0, 1.0], "b": [10.0, 5.0]},
        "v": {"a_full": [1.0, 1.0], "a_plain": [2.0, 2.0], "b": [0.5, 0.5]},
    }
    order = [(label, workload) for _, label, workload in log]
    assert order == [
        *[("a_plain", "w"), ("b", "w"), ("a_full", "w")],
        *[("a_plain", "v"), ("b", "v"), ("a_full", "v")],
        *[("b", "w"), ("a_full", "w"), ("a_plain", "w")],
        *[("b", "v"), ("a_full", "v"), ("a_plain", "v")],
    ]


def test_runs_are_spread_over_engine_starts_and_each_figure_is_the_median_of_all(monkeypatch):
    log: list = []
    workloads = {"w": (2, (5, 5), 10)}  # 20 tokens a call
    # Start 1 is slow (seconds 4), start 2 fast (1), start 3 in between (2): 5 runs over 3
    # starts are 2 + 2 + 1, so the median over all is 2 s, 10 tokens/s; per start, 5, 20, 10.
    per_start = [[4.0, 4.0], [1.0, 1.0], [2.0]]
    hosts = [
        [{"host_ms_per_decode_step": 3.0}] * 2,
        [{"host_ms_per_decode_step": 1.0}] * 2,
        [{"host_ms_per_decode_step": 2.0}],
    ]
    starts = []

    class FakeTurns(Turns):
        def __init__(self, workers, model_dir, settings, workloads_, plain):
            index = len(starts)
            starts.append((tuple(workers), plain))
            self.workloads = workloads_
            self._workers = {
                "x": FakeWorker(
                    {("x", "w"): list(per_start[index])},
                    log,
                    host_labels=["x"],
                )
            }
            self._workers["x"]._answers_host = list(hosts[index])
            real_ask = self._workers["x"].ask

            def ask(command, worker=self._workers["x"]):
                if command["op"] == "host":
                    log.append(("host", command["label"], command["workload"]))
                    return worker._answers_host.pop(0)
                return real_ask(command)

            self._workers["x"].ask = ask

    monkeypatch.setattr(turns_module, "Turns", FakeTurns)
    measured = measure(["x"], None, {}, workloads, runs=5, starts=3, checks={"x": ["c"]})
    assert starts == [(("x",), False)] * 3
    assert measured.rates == {"w": {"x": pytest.approx(10.0)}}
    assert measured.host == {"w": {"x": {"host_ms_per_decode_step": 2.0}}}
    assert measured.checks == {"x": {"c": "checked c"}}
    assert [op for op, *_ in log].count("time") == 5 and [op for op, *_ in log].count("host") == 5
