"""`--help` of every command shows every option's default, and lists the presets the
presets directory holds (no engine)."""

from __future__ import annotations

import argparse

import tpu_configs
from sgl_jax_rollout_apps.cli import build_parser


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def test_every_option_shows_its_default():
    missing = []
    for name, command in commands().items():
        text = " ".join(command.format_help().split())
        for action in command._actions:
            default = action.default
            if not action.option_strings or any(
                default is x for x in (None, False, argparse.SUPPRESS)
            ):
                continue
            if "default" not in (action.help or "") and f"(default: {default})" not in text:
                missing.append(f"{name} {action.option_strings[0]} ({default!r})")
    assert not missing, missing


def test_preset_options_list_every_preset():
    names = tpu_configs.names()
    assert "cpu-2host" in names
    for name in ("demo", "plan", "check", "compare"):
        text = " ".join(commands()[name].format_help().split())
        assert all(preset in text for preset in names), name
