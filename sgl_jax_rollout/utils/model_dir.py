"""A checkpoint directory read once, with one sentence for what is wrong with it.

Owns `read_config` (`config.json` as a dict: a missing file, invalid JSON with its line and
column, or JSON that is no object, each named with the file) and `check_weights` (the
directory holds `*.safetensors`), `load_tokenizer` (its HF tokenizer, or the sentence saying it
does not load). `missing_key` turns a `KeyError` raised while a family's
config is read into the sentence that names the file, the key and the family. Both the engine
(`engine.RolloutEngine`) and the trainer side (`tunix_adapter.models`) call these before
anything is built, so a broken directory never reaches sgl-jax or tunix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """`model_dir/config.json` as a dict; ValueError naming the file and what is wrong."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} is no model directory: it has no config.json")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
        ) from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text: {err.reason}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, it holds a {type(config).__name__}")
    return config


def missing_key(model_dir: str | Path, config: dict[str, Any], err: KeyError) -> ValueError:
    """The error for a key a family needs that `model_dir`'s config.json lacks."""
    family = config.get("model_type", "this")
    return ValueError(
        f"{Path(model_dir) / 'config.json'} has no {err.args[0]!r}, which a {family} model needs"
    )


def check_weights(model_dir: str | Path) -> None:
    """ValueError when `model_dir` holds no `*.safetensors` file (the weights)."""
    if not any(Path(model_dir).glob("*.safetensors")):
        raise ValueError(
            f"{model_dir} holds no *.safetensors file: the checkpoint's weights are missing"
        )


def load_tokenizer(model_dir: str | Path) -> Any:
    """`model_dir`'s HF tokenizer; ValueError naming the directory when it does not load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as err:  # transformers raises OSError, ValueError, JSON and others
        raise ValueError(
            f"{model_dir}'s tokenizer does not load ({type(err).__name__}: {err})"
        ) from err
