"""`sgl-jax-rollout figures`: the README's figures measured again, each against its noise.

Owns the subparser and the handler, which calls `sgl_jax_rollout_apps.figures.runner` and
prints its report (JSON), or the list of figures; exit 1 when a figure moved past its noise
or its command gave no output to read it from.
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_OUT = "figures_out"
DEFAULT_MAX_MINUTES = 15.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    fig = sub.add_parser(
        "figures",
        help="run the commands behind the README's figures again and fail where a figure "
        "moved past its noise",
        description="Each figure of the README is read from the output of the "
        "command that measures it (a source); the sources chosen run once each, in a process of "
        "their own, one after the other, so run it on a quiet machine. Prints a JSON report "
        "(the README's value, the fresh one, the allowed spread, per figure); exits 1 when a "
        "figure moved past its noise or a source gave no output.",
    )
    fig.add_argument("--list", action="store_true", help="list the figures and their sources")
    fig.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SOURCE",
        help="run this source (repeatable; its name as --list shows it) (default: every "
        "source within --max-minutes)",
    )
    fig.add_argument(
        "--max-minutes",
        type=float,
        default=DEFAULT_MAX_MINUTES,
        help="leave out the sources that take longer than this here (default: 15)",
    )
    fig.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help="where each source's output is kept, one directory each (default: figures_out)",
    )
    fig.add_argument(
        "--saved",
        action="store_true",
        help="judge the outputs a former run left in --out, running nothing",
    )
    fig.set_defaults(func=_figures)


def _figures(args: argparse.Namespace) -> int:
    from sgl_jax_rollout_apps.figures import runner

    if args.list:
        print(runner.listing())
        return 0
    report = runner.check_figures(
        args.out,
        only=args.only,
        max_minutes=args.max_minutes,
        saved=args.saved,
        progress=lambda line: print(f"figures: {line}", file=sys.stderr, flush=True),
    )
    print(json.dumps(report, indent=1))
    for verdict in report["figures"]:
        if not verdict["ok"]:
            print(
                f"figures: {verdict['readme']!r} ({verdict['source']}): {verdict['why']}",
                file=sys.stderr,
            )
    print(
        f"figures: {report['checked'] - report['drifted']} of {report['checked']} figures "
        f"within their noise",
        file=sys.stderr,
    )
    return 0 if report["ok"] else 1
