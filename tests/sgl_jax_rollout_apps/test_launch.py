"""`sgl-jax-rollout launch`: N JAX processes on this machine joined into one system; the
first failure or the time limit ends every process (tests/sgl_jax_rollout_apps/launch_probe.py
is the launched command)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, "-m", "tests.sgl_jax_rollout_apps.launch_probe"]


def _launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sgl_jax_rollout_apps.cli", "launch", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _running(marker: str) -> list[int]:
    """Pids of running processes (not zombies) whose command line holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if marker not in (proc / "cmdline").read_bytes().decode(errors="replace"):
                continue
            if (proc / "stat").read_text().split()[2] != "Z":
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue  # not a process, or it ended meanwhile
    return found


def test_two_processes_of_four_devices_are_one_jax_system():
    done = _launch("--processes", "2", "--devices-per-process", "4", "--", *PROBE, "sum")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        # every device of both processes contributed: 0 + 1 + ... + 7
        assert f"[p{rank}] RESULT processes=2 devices=8 local=4 sum=28" in done.stdout


def test_a_failing_process_ends_the_others(tmp_path):
    pids = tmp_path / "pid"
    start = time.monotonic()
    done = _launch("--processes", "3", "--", *PROBE, "fail", str(pids))
    assert done.returncode == 3
    assert "process 1 exited with 3" in done.stderr
    assert time.monotonic() - start < 60
    # every process is gone, also one ended before it wrote its pid file
    assert (tmp_path / "pid.1").exists() and not _running(str(pids))


def test_the_time_limit_ends_every_process(tmp_path):
    pids = tmp_path / "pid"
    done = _launch("--timeout", "3", "--", *PROBE, "sleep", str(pids))
    assert done.returncode == 124
    assert "time limit of 3 s" in done.stderr
    assert not _running(str(pids))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0", "--", "true"], "processes must be >= 1"),
        (["--devices-per-process", "0", "--", "true"], "devices_per_process must be >= 1"),
        (["--"], "launch needs a command after --"),
    ],
)
def test_bad_arguments_are_named(args, message):
    done = _launch(*args)
    assert done.returncode == 2 and message in done.stderr


def test_progress_bar_redraws_are_relayed_as_throttled_lines_of_their_own(monkeypatch, capsys):
    """`_relay` on a stand-in child whose output is fixed bytes (this is about the relay's
    own splitting): a bar's redraws end in carriage returns, the first is shown, the next
    ones within `BAR_EVERY_S` are not, a clearing redraw is dropped, and the text after the
    bar starts a line of its own."""
    import io
    from types import SimpleNamespace

    from sgl_jax_rollout_apps import launch

    written = b"start\n\rbar 1/3\rbar 2/3\r" + b" " * 20 + b"\rRESULT ok\nno newline at the end"
    child = SimpleNamespace(stdout=io.BufferedReader(io.BytesIO(written)))
    launch._relay(child, 1)
    assert capsys.readouterr().out.splitlines() == [
        "[p1] start",
        "[p1] bar 1/3",
        "[p1] RESULT ok",
        "[p1] no newline at the end",
    ]
    monkeypatch.setattr(launch, "BAR_EVERY_S", 0.0)
    launch._relay(SimpleNamespace(stdout=io.BufferedReader(io.BytesIO(written))), 0)
    assert "[p0] bar 2/3" in capsys.readouterr().out.splitlines()
