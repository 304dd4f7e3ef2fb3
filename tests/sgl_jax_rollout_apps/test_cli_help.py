"""`--help` of every command shows every option's default, and lists the presets the
presets directory holds (no engine)."""

from __future__ import annotations

import argparse
import re

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


# Options that take a value and have no default worth writing: the subject of the command.
NO_DEFAULT = {"--model-path", "--preset", "--like", "--wheel", "--vocab", "--seeds"}


def test_every_option_that_takes_a_value_says_its_default_one_way():
    """Written defaults read "(default: X)" (or "(required)"), in every command; an option
    whose argparse default is None (the demo's task-run sizes, the off-by-default
    corrections) writes its own."""
    unsaid, other_forms = [], []
    for name, command in commands().items():
        for action in command._actions:
            if not action.option_strings or action.nargs == 0 or action.help is None:
                continue
            help_text = " ".join(action.help.split())
            flag = action.option_strings[-1]
            if re.search(r"\bdefault\b", re.sub(r"\(default: [^)]*\)", "", help_text)):
                other_forms.append(f"{name} {flag}: {help_text}")
            said = "(default: " in help_text or "(required)" in help_text
            if not said and action.default is None and flag not in NO_DEFAULT:
                unsaid.append(f"{name} {flag}")
    assert not other_forms, other_forms
    assert not unsaid, unsaid


def test_preset_options_list_every_preset():
    names = tpu_configs.names()
    assert "cpu-2host" in names
    for name in ("demo", "plan", "check", "compare"):
        text = " ".join(commands()[name].format_help().split())
        assert all(preset in text for preset in names), name
