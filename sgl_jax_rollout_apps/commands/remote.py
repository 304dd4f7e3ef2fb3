"""`sgl-jax-rollout remote-run`: tunix main's distributed RL over gRPC on this machine.

Owns the subparser and the handler, which runs `sgl_jax_rollout_apps.remote_run` and prints
its report as JSON: exit 0 when the run is ok, 1 when not, 2 when tunix main or grpcio is not
installed here (checked before any worker starts).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

from sgl_jax_rollout_apps.commands.engine import engine_missing


def add_parser(sub: argparse._SubParsersAction) -> None:
    remote = sub.add_parser(
        "remote-run",
        help="our rollout workers under tunix main's gRPC remote execution, on this machine",
        description="Starts --workers rollout workers (tunix main's RolloutWorker on our "
        "SglangJaxSampler), each a process served by tunix's gRPC remote execution on a free "
        "localhost port, and runs an orchestrator loop over them: each epoch samples prompts "
        "on every worker and scores every completion with tunix's trainer; a weight-sync round "
        "sends new weights to every worker between epochs. Prints the report as JSON; the "
        "workers are stopped and their ports freed at the end. Needs tunix main and grpcio "
        "(make tunix-main-env).",
    )
    remote.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    remote.add_argument("--epochs", type=int, default=2, help="epochs (a round between each)")
    remote.add_argument("--prompts-per-worker", type=int, default=2, help="prompts per epoch")
    remote.add_argument("--max-tokens", type=int, default=16, help="tokens per completion")
    remote.add_argument("--model-path", default=None, help="HF checkpoint dir (default: tiny)")
    remote.add_argument("--seed", type=int, default=0, help="seeds the sampling and the update")
    remote.set_defaults(func=_remote_run)


def _remote_run(args: argparse.Namespace) -> int:
    from sgl_jax_rollout import tunix_compat

    missing = [
        what
        for what, present in (
            ("tunix main (tunix.experimental)", tunix_compat.has_experimental()),
            ("grpcio", importlib.util.find_spec("grpc") is not None),
        )
        if not present
    ]
    if missing:
        print(
            f"sgl-jax-rollout: error: remote-run needs {' and '.join(missing)}: run it in the "
            "environment `make tunix-main-env` builds (.venv-tunix-main)",
            file=sys.stderr,
        )
        return 2
    if engine_missing():
        return 2
    from sgl_jax_rollout_apps import remote_run

    try:
        config = remote_run.RemoteRunConfig(
            workers=args.workers,
            epochs=args.epochs,
            prompts_per_worker=args.prompts_per_worker,
            max_tokens=args.max_tokens,
            model_path=args.model_path,
            seed=args.seed,
        )
    except ValueError as err:
        print(f"sgl-jax-rollout: error: remote-run: {err}", file=sys.stderr)
        return 2
    report = remote_run.run(config, progress=lambda line: print(line, file=sys.stderr))
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1
