"""The README's examples run as written: each block marked `<!-- readme-example: NAME -->`
runs, unchanged, in a fresh interpreter (the rollout, training and session examples start an
engine of their own, so they are engine-marked and take up to a minute each on CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_MARKED = re.compile(r"<!-- readme-example: (\w+) [^>]*-->\n```python\n(.*?)```", re.DOTALL)


def readme_examples() -> dict[str, str]:
    return dict(_MARKED.findall((ROOT / "README.md").read_text()))


def _run(source: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(source + "\nprint('EXAMPLE DONE')\n")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0 and "EXAMPLE DONE" in done.stdout, done.stderr[-4000:]


def test_the_marked_examples_are_there():
    assert set(readme_examples()) == {"sampler", "rollout", "training", "session"}


def test_sampler_example(tmp_path):
    _run(readme_examples()["sampler"], tmp_path)


@pytest.mark.engine
def test_rollout_example(tmp_path):
    _run(readme_examples()["rollout"], tmp_path)


@pytest.mark.engine
def test_training_example(tmp_path):
    _run(readme_examples()["training"], tmp_path)


@pytest.mark.engine
def test_session_example(tmp_path):
    """The session block on the built-in model, whose random weights can end a turn with the
    pad id: the turn ends before it (`rollout_inputs.cut_at_pad`), so the next prompt holds
    no pad and `chat_extend` goes on."""
    _run(readme_examples()["session"], tmp_path)


def readme_commands() -> list[str]:
    """Every command line of the README's bash blocks, comments and line-leading environment
    assignments dropped, optional `[...]` parts kept (so their flags are checked too)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    lines = [re.sub(r"^(export )?([A-Z_]+=\S+ ?)+", "", line) for line in lines]
    return [re.sub(r"\[([^\]]*)\]", r"\1", line) for line in lines if line and line[0] != "#"]


def _parses(argv: list[str]) -> None:
    from sgl_jax_rollout_apps.cli import build_parser

    args = build_parser().parse_args(argv)
    if args.command == "launch":
        _parses([a for a in args.launched if a != "--"])


def test_every_readme_command_names_a_make_target_or_parses_as_the_cli():
    """The bash blocks' commands as written: `make T` names a target of the Makefile (its
    DEMO_ARGS parse as `demo` options, its MODEL as `demo --model`), `sgl-jax-rollout ...`
    parses, flags and values (argparse exits on an unknown flag or choice), a launched command
    included."""
    import shlex

    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    commands = readme_commands()
    assert len(commands) >= 15, commands
    assert "source .venv/bin/activate" in commands  # the CLI is not on PATH before
    for line in commands:
        words = shlex.split(line)
        if words == ["source", ".venv/bin/activate"]:
            continue
        if words[0] == "make":
            assert words[1] in targets, line
            for extra in (w.split("=", 1)[1] for w in words[2:] if w.startswith("DEMO_ARGS=")):
                _parses(["demo", *shlex.split(extra)])
            for model in (w.split("=", 1)[1] for w in words[2:] if w.startswith("MODEL=")):
                _parses(["demo", "--model", model])
        else:
            assert words[0] == "sgl-jax-rollout", line
            _parses(words[1:])
