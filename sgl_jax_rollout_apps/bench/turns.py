"""Benchmark columns on engines of their own, one process each, timed in turns.

Owns both ends of one small protocol. `Turns` (the benchmark's side) starts one worker
process per column (`columns.build`), one after another; each builds its engine, makes every
call once (warm-up, compiles included) and reports ready. A worker that is not being timed is
stopped (SIGSTOP), so it takes no CPU: the stock engine's scheduler polls while idle, and this
machine's cores are the device's too. `Turns.rounds` then makes, in each round, every call of
every column once, the columns in an order rotated each round, so a drift in the machine's
speed over the run reaches every column alike. `measure` spreads a benchmark's runs over
several starts of every worker (on this 2-core CPU one engine start's model step measured
31 ms and another's 42 ms on the same workload) and takes the medians over all of them:
tokens/s per workload and label, and the host time per step (`engine.profiling.host_time`) of
the columns that have a model runner; and runs one-off checks on the first start.

`serve` is the worker's side (`python -m sgl_jax_rollout_apps.bench.turns WORKER MODEL_DIR
SETTINGS_JSON WORKLOADS_JSON PLAIN`): one JSON command per line on stdin, one JSON answer per
line on stdout after `ANSWER` (other libraries print there too); its log goes to a file the
benchmark shows the end of if the worker fails.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

ANSWER = "@turns "


@dataclasses.dataclass
class Measured:
    rates: dict[str, dict[str, float]]  # workload -> label -> tokens/s
    host: dict[str, dict[str, dict[str, float]]]  # workload -> label -> figures per step
    checks: dict[str, Any]  # worker -> check name -> value


def measure(
    workers: list[str],
    model_dir: Path,
    settings: dict,
    workloads: dict,
    runs: int,
    starts: int,
    plain: bool = False,
    checks: dict[str, list[str]] | None = None,
) -> Measured:
    """`runs` timed calls of every column, spread over `starts` starts of every worker (a
    column's speed differs from one engine start to the next by more than the differences
    measured here), in rotated turns; tokens/s and host figures are medians over all of them.
    `checks` (worker -> check names) run once, on the first start."""
    seconds: dict[str, dict[str, list]] = {name: {} for name in workloads}
    host: dict[str, dict[str, list]] = {name: {} for name in workloads}
    done_checks: dict[str, Any] = {}
    first_round = 0
    for start in range(starts):
        rounds = runs // starts + (start < runs % starts)
        print(f"bench: engine start {start + 1} of {starts}, {rounds} run(s)", file=sys.stderr)
        turns = Turns(workers, model_dir, settings, workloads, plain)
        try:
            _extend(seconds, turns.rounds("time", rounds, first_round))
            _extend(host, turns.rounds("host", rounds, first_round))
            if start == 0:
                for worker, names in (checks or {}).items():
                    done_checks[worker] = {name: turns.check(worker, name) for name in names}
        finally:
            turns.close()
        first_round += rounds
    rates = {
        name: {
            label: count * new_tokens / statistics.median(values)
            for label, values in seconds[name].items()
        }
        for name, (count, _, new_tokens) in workloads.items()
    }
    host_medians = {
        name: {
            label: {key: statistics.median(s[key] for s in values) for key in values[0]}
            for label, values in by_label.items()
        }
        for name, by_label in host.items()
    }
    return Measured(rates, host_medians, done_checks)


def _extend(into: dict[str, dict[str, list]], more: dict[str, dict[str, list]]) -> None:
    for name, by_label in more.items():
        for label, values in by_label.items():
            into[name].setdefault(label, []).extend(values)


class Turns:
    """One start of every worker: `rounds("time" | "host", ...)` times them in turns."""

    def __init__(
        self, workers: list[str], model_dir: Path, settings: dict, workloads: dict, plain: bool
    ):
        self.workloads = workloads
        self._workers: dict[str, _Worker] = {}
        try:
            for worker in workers:
                started = _Worker(worker, model_dir, settings, workloads, plain)
                self._workers[worker] = started
                taken = [label for w in self._workers.values() for label in w.labels]
                if len(set(taken)) != len(taken):
                    raise RuntimeError(f"bench worker {worker} times a label another one does")
        except BaseException:
            self.close()
            raise

    def rounds(self, op: str, rounds: int, first_round: int = 0) -> dict[str, dict[str, list]]:
        """Workload -> label -> one answer per round: call seconds (`time`) or a host time
        sample (`host`, columns with a model runner only). In each round every column is
        asked once per workload, starting one column further than the round before."""
        pairs = [
            (worker, label)
            for worker in self._workers.values()
            for label in (worker.labels if op == "time" else worker.host_labels)
        ]
        out: dict[str, dict[str, list]] = {name: {} for name in self.workloads}
        if not pairs:
            return out
        what = "tokens/s" if op == "time" else "host time"
        bar = tqdm(total=rounds * len(pairs) * len(self.workloads), desc=what, file=sys.stderr)
        with bar:
            for round_ in range(first_round, first_round + rounds):
                for name in self.workloads:
                    shift = round_ % len(pairs)
                    for worker, label in pairs[shift:] + pairs[:shift]:
                        answer = worker.ask({"op": op, "label": label, "workload": name})
                        out[name].setdefault(label, []).append(answer)
                        bar.update()
        return out

    def check(self, worker: str, name: str) -> Any:
        return self._workers[worker].ask({"op": "check", "name": name})

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers = {}


class _Worker:
    """One worker process, stopped between commands."""

    def __init__(self, worker: str, model_dir: Path, settings: dict, workloads: dict, plain: bool):
        self.name = worker
        # Closed (and removed) by `close`: it outlives this call.
        self._log = tempfile.NamedTemporaryFile(prefix=f"bench-{worker}-", suffix=".log")  # noqa: SIM115
        print(f"bench: starting {worker} on {model_dir} (log {self._log.name})", file=sys.stderr)
        start = time.perf_counter()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "sgl_jax_rollout_apps.bench.turns", worker, str(model_dir)]
            + [json.dumps(settings), json.dumps(workloads), "1" if plain else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            preexec_fn=_die_with_parent,
        )
        self._stopped = False
        try:
            ready = self._read()
        except BaseException:
            self._proc.kill()
            raise
        self.labels, self.host_labels = ready["labels"], ready["host_labels"]
        self._stop()
        print(f"bench: {worker} ready in {time.perf_counter() - start:.0f}s", file=sys.stderr)

    def ask(self, command: dict) -> Any:
        self._continue()
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()
        answer = self._read()
        self._stop()
        return answer

    def close(self) -> None:
        if self._proc.poll() is None:
            self._continue()
            try:
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def _read(self) -> Any:
        for line in self._proc.stdout:
            if ANSWER in line:  # after anything another library printed without a newline
                return json.loads(line[line.index(ANSWER) + len(ANSWER) :])
        self._proc.wait()
        self._log.seek(0)
        tail = self._log.read()[-3000:].decode(errors="replace")
        raise RuntimeError(f"bench worker {self.name} exited ({self._proc.returncode}):\n{tail}")

    def _stop(self) -> None:
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._stopped = True

    def _continue(self) -> None:
        if self._stopped:
            os.kill(self._proc.pid, signal.SIGCONT)
            self._stopped = False


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL when the benchmark's process ends, however it ends
    (a stopped worker would otherwise wait forever)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(worker: str, model_dir: Path, settings: dict, workloads: dict, plain: bool) -> None:
    from sgl_jax_rollout.engine.profiling import host_time
    from sgl_jax_rollout_apps.bench.columns import build

    column = build(worker, model_dir, settings, workloads, plain)
    for by_workload in column.calls.values():
        for call in by_workload.values():
            call()  # warm-up
    host_labels = [] if column.runner is None else list(column.calls)
    _answer({"labels": list(column.calls), "host_labels": host_labels})
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        if command["op"] == "check":
            _answer(column.checks[command["name"]]())
            continue
        call = column.calls[command["label"]][command["workload"]]
        if command["op"] == "time":
            start = time.perf_counter()
            call()
            _answer(time.perf_counter() - start)
        else:
            _answer(host_time(column.runner, call, 1))
    column.shutdown()


def _answer(value: Any) -> None:
    sys.stdout.write(ANSWER + json.dumps(value) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    serve(
        sys.argv[1],
        Path(sys.argv[2]),
        json.loads(sys.argv[3]),
        json.loads(sys.argv[4]),
        sys.argv[5] == "1",
    )
    sys.stdout.flush()
    os._exit(0)  # upstream's Engine registered an atexit shutdown that kills child processes
