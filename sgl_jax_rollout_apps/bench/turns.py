"""Benchmark columns on engines of their own, one process each, timed in turns.

Owns both ends of one small protocol. `Turns` (the benchmark's side) starts one worker
process per column (`columns.build`), one after another; each builds its engine, makes every
call once (warm-up, compiles included) and reports ready. A worker that is not being timed is
stopped (SIGSTOP), so it takes no CPU: the stock engine's scheduler polls while idle, and this
machine's cores are the device's too. `rates(runs)` then makes, in each of `runs` rounds, every
call of every column once, the columns in an order rotated each round, so a drift in the
machine's speed over the run reaches every column alike: tokens/s per workload and label, the
median over the rounds. `host(runs)` does the same for the host time per step
(`engine.profiling.host_time`) of the columns that have a model runner, `check(name)` runs a
column's one-off check.

`serve` is the worker's side (`python -m sgl_jax_rollout_apps.bench.turns WORKER MODEL_DIR
SETTINGS_JSON WORKLOADS_JSON PLAIN`): one JSON command per line on stdin, one JSON answer per
line on stdout after `ANSWER` (other libraries print there too); its log goes to a file the
benchmark shows the end of if the worker fails.
"""

from __future__ import annotations

import ctypes
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


class Turns:
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

    def rates(self, runs: int) -> dict[str, dict[str, float]]:
        """Workload -> label -> tokens/s, the median of `runs` rounds."""
        seconds = self._rounds("time", runs, lambda worker: worker.labels, "tokens/s")
        return {
            name: {
                label: count * new_tokens / statistics.median(values)
                for label, values in seconds[name].items()
            }
            for name, (count, _, new_tokens) in self.workloads.items()
        }

    def host(self, runs: int) -> dict[str, dict[str, dict[str, float]]]:
        """Workload -> label -> host, sampler and model ms per step (medians of `runs` rounds)
        and steps, for each column with a model runner."""
        samples = self._rounds("host", runs, lambda worker: worker.host_labels, "host time")
        return {
            name: {
                label: {key: statistics.median(s[key] for s in values) for key in values[0]}
                for label, values in by_label.items()
            }
            for name, by_label in samples.items()
        }

    def check(self, worker: str, name: str) -> Any:
        return self._workers[worker].ask({"op": "check", "name": name})

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers = {}

    def _rounds(self, op: str, runs: int, labels_of, what: str) -> dict[str, dict[str, list]]:
        pairs = [(w, label) for w in self._workers.values() for label in labels_of(w)]
        out: dict[str, dict[str, list]] = {name: {} for name in self.workloads}
        if not pairs:
            return out
        bar = tqdm(total=runs * len(pairs) * len(self.workloads), desc=what, file=sys.stderr)
        with bar:
            for round_ in range(runs):
                for name in self.workloads:
                    shift = round_ % len(pairs)
                    for worker, label in pairs[shift:] + pairs[:shift]:
                        answer = worker.ask({"op": op, "label": label, "workload": name})
                        out[name].setdefault(label, []).append(answer)
                        bar.update()
        return out


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
