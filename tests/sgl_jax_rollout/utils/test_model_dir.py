"""A broken checkpoint directory gets one sentence naming the file and what is wrong
(`sgl_jax_rollout.utils.model_dir`), on copies of the built-in model broken one way each; the
trainer side and the CLI: tests/tunix_adapter/test_model_dir_errors.py."""

from __future__ import annotations

import json
import shutil

import pytest

from sgl_jax_rollout.utils.model_dir import check_weights, load_tokenizer, read_config


@pytest.fixture
def copy(tiny_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(tiny_dir, target)
    return target


def test_a_truncated_config_names_the_file_line_and_column(copy):
    config = copy / "config.json"
    config.write_text(config.read_text()[:2])
    with pytest.raises(ValueError) as err:
        read_config(copy)
    assert str(err.value) == (
        f"{config} is not valid JSON: Expecting property name enclosed in double quotes at "
        "line 2, column 1"
    )


@pytest.mark.parametrize(
    ("breaks", "match"),
    [
        (lambda d: (d / "config.json").unlink(), r"is no model directory: it has no config.json"),
        (lambda d: (d / "config.json").write_text("[1, 2]"), r"must hold a JSON object"),
        (lambda d: (d / "config.json").write_bytes(b"\xff\xfe{"), r"is not UTF-8 text"),
    ],
)
def test_other_config_mistakes_are_named(copy, breaks, match):
    breaks(copy)
    with pytest.raises(ValueError, match=match):
        read_config(copy)


def test_missing_weights_and_a_tokenizer_that_does_not_load_are_named(copy):
    assert read_config(copy)["model_type"] == "qwen3"
    check_weights(copy)
    assert load_tokenizer(copy) is not None
    for weights in copy.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ValueError, match=r"holds no \*.safetensors file: the checkpoint's weights"):
        check_weights(copy)
    (copy / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    for extra in ("tokenizer_config.json", "vocab.json", "merges.txt"):
        (copy / extra).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"model's tokenizer does not load \("):
        load_tokenizer(copy)
