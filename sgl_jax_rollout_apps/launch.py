"""`sgl-jax-rollout launch`: one command as N JAX processes on this machine (simulated hosts).

Owns the multi-process launch on one machine and the matching start-up in each process:
- `launch(command, processes, devices_per_process, timeout_s)` starts `processes` copies of
  `command`, each with `devices_per_process` simulated CPU devices and the coordinates of one
  JAX process (`SGL_JAX_ROLLOUT_COORDINATOR`, `SGL_JAX_ROLLOUT_NUM_PROCESSES`,
  `SGL_JAX_ROLLOUT_PROCESS_ID`; the coordinator on a free port of 127.0.0.1), prefixes their
  output with `[p<i>]`, and ends them all (their whole process groups) as soon as one fails, on
  the time limit, or on Ctrl-C. Returns the first non-zero exit code, 124 on the time limit.
- `initialize_from_env()`: what each such process calls before anything runs on a JAX device:
  `jax.distributed.initialize` with those coordinates and CPU collectives over gloo. Without
  the variables (a plain run) it does nothing. `sgl-jax-rollout`'s own subcommands call it.

On a real pod, one process per host runs the same command with
`SGL_JAX_ROLLOUT_DISTRIBUTED=auto`: `initialize_from_env()` then calls
`jax.distributed.initialize()` without arguments (docs/guide.md, "Multiple hosts"). Must not
be imported by the library: it is an application.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

COORDINATOR = "SGL_JAX_ROLLOUT_COORDINATOR"
NUM_PROCESSES = "SGL_JAX_ROLLOUT_NUM_PROCESSES"
PROCESS_ID = "SGL_JAX_ROLLOUT_PROCESS_ID"
# Set to "auto" on every host of a real pod: jax.distributed.initialize() without arguments
# (Cloud TPU finds the coordinator and the process's index itself).
DISTRIBUTED = "SGL_JAX_ROLLOUT_DISTRIBUTED"
TIMED_OUT = 124
# Seconds a process gets to end after SIGTERM before it is killed.
GRACE_S = 5.0
# Seconds between two relayed redraws of a process's progress bar.
BAR_EVERY_S = 10.0


def initialize_from_env() -> bool:
    """`jax.distributed.initialize` from the launcher's variables, or without arguments where
    `SGL_JAX_ROLLOUT_DISTRIBUTED=auto` (a real pod) (True); else nothing (False)."""
    address = os.environ.get(COORDINATOR)
    mode = os.environ.get(DISTRIBUTED)
    if mode not in (None, "", "auto"):
        raise ValueError(f"{DISTRIBUTED} must be 'auto' or unset, got {mode!r}")
    if address is None:
        if mode != "auto":
            return False
        import jax

        jax.distributed.initialize()
        return True
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        address,
        num_processes=int(os.environ[NUM_PROCESSES]),
        process_id=int(os.environ[PROCESS_ID]),
    )
    return True


def launch(
    command: Sequence[str], processes: int, devices_per_process: int, timeout_s: float
) -> int:
    """Runs `command` as `processes` JAX processes; see the module docstring."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if devices_per_process < 1:
        raise ValueError(f"devices_per_process must be >= 1, got {devices_per_process}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if not command:
        raise ValueError("no command to launch (give it after --)")
    address = f"127.0.0.1:{_free_port()}"
    children, relays = [], []
    try:
        for rank in range(processes):
            env = dict(
                os.environ,
                JAX_PLATFORMS="cpu",
                XLA_FLAGS=(
                    os.environ.get("XLA_FLAGS", "")
                    + f" --xla_force_host_platform_device_count={devices_per_process}"
                ).strip(),
                **{COORDINATOR: address, NUM_PROCESSES: str(processes), PROCESS_ID: str(rank)},
            )
            child = subprocess.Popen(
                list(command),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, ended as a whole
            )
            children.append(child)
            relays.append(threading.Thread(target=_relay, args=(child, rank), daemon=True))
            relays[-1].start()
        return _wait(children, time.monotonic() + timeout_s, timeout_s)
    finally:
        _end(children)
        for relay in relays:  # every line the processes wrote is out before we return
            relay.join(timeout=GRACE_S)


def _wait(children: list[subprocess.Popen], deadline: float, timeout_s: float) -> int:
    """The first non-zero exit code (the others are ended then), 0 when all succeed, or
    `TIMED_OUT`."""
    while True:
        codes = [child.poll() for child in children]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            print(f"launch: process {rank} exited with {code}; ending the others", file=sys.stderr)
            return code
        if all(code == 0 for code in codes):
            return 0
        if time.monotonic() > deadline:
            print(f"launch: time limit of {timeout_s:g} s reached; ending all", file=sys.stderr)
            return TIMED_OUT
        time.sleep(0.05)


def _end(children: list[subprocess.Popen]) -> None:
    """SIGTERM to every process group still running, SIGKILL after `GRACE_S`."""
    running = [c for c in children if c.poll() is None]
    for child in running:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for child in running:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            child.wait()
    for child in children:  # the group may outlive its leader
        _signal_group(child, signal.SIGKILL)


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, sig)


def _relay(child: subprocess.Popen, rank: int) -> None:
    """A process's output, line by line with its `[p<i>]` prefix. A progress bar's redraws
    (text ended by a carriage return) come out as lines too, at most one per `BAR_EVERY_S`
    a process, so they neither flood the output nor share a line with what follows them;
    blank redraws (a bar clearing itself) are dropped."""
    pending, last_bar = b"", -BAR_EVERY_S
    for chunk in iter(lambda: child.stdout.read1(1 << 16), b""):
        *pieces, pending = re.split(rb"(?<=[\r\n])", pending + chunk)
        for piece in pieces:
            text = piece[:-1].decode(errors="replace").rstrip()
            bar = piece.endswith(b"\r")
            if not text or (bar and time.monotonic() - last_bar < BAR_EVERY_S):
                continue
            last_bar = time.monotonic() if bar else last_bar
            sys.stdout.write(f"[p{rank}] {text}\n")
        sys.stdout.flush()
    if pending.strip():
        sys.stdout.write(f"[p{rank}] {pending.decode(errors='replace').rstrip()}\n")
        sys.stdout.flush()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
