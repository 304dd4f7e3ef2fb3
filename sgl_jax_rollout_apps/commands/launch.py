"""`sgl-jax-rollout launch -- COMMAND`: COMMAND as N JAX processes on this machine.

Owns the subparser (added last: it names every other subcommand), its argument check and the
handler, which runs a subcommand of this CLI (or any command) through
`sgl_jax_rollout_apps.launch.launch`.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "launch",
        help="run a command as N JAX processes on this machine (simulated hosts)",
        description="Runs COMMAND (a sgl-jax-rollout subcommand, or any command) as N "
        "processes, each with its own simulated CPU devices and joined into one JAX system "
        "(jax.distributed on a local coordinator). Output lines carry [p<i>]; the first "
        "process that fails, the time limit or Ctrl-C ends them all.",
    )
    run.add_argument("--processes", type=int, default=2, help="JAX processes (>= 1)")
    run.add_argument(
        "--devices-per-process", type=int, default=4, help="simulated CPU devices each (>= 1)"
    )
    run.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    run.add_argument("launched", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.set_defaults(func=_launch, subcommands=tuple(sub.choices))


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`parser.error` when no command follows `--`."""
    if not [a for a in args.launched if a != "--"]:
        parser.error("launch needs a command after --")


def _launch(args: argparse.Namespace) -> int:
    from sgl_jax_rollout_apps.launch import launch

    command = args.launched[1:] if args.launched[:1] == ["--"] else args.launched
    if command[:1] and command[0] in args.subcommands:
        command = [sys.executable, "-m", "sgl_jax_rollout_apps.cli", *command]
    return launch(command, args.processes, args.devices_per_process, args.timeout)
