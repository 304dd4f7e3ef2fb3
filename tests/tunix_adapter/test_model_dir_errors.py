"""A broken model directory reaches neither tunix nor the engine: the trainer side's loader and
the CLI's commands answer with the sentence `sgl_jax_rollout.utils.model_dir` gives (a config
key a family needs, missing or truncated weights, invalid JSON), before anything is built."""

from __future__ import annotations

import json
import shutil

import pytest

from sgl_jax_rollout_apps import cli
from tunix_adapter.models import load_tunix_model, tunix_model_config


@pytest.fixture
def copy(tiny_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(tiny_dir, target)
    return target


def without(copy, key: str) -> None:
    config = json.loads((copy / "config.json").read_text())
    del config[key]
    (copy / "config.json").write_text(json.dumps(config))


def test_a_key_the_family_needs_is_named_with_the_file(copy):
    without(copy, "num_hidden_layers")
    with pytest.raises(ValueError) as err:
        tunix_model_config(copy)
    assert str(err.value) == (
        f"{copy / 'config.json'} has no 'num_hidden_layers', which a qwen3 model needs"
    )


def test_missing_weights_are_named_before_tunix_loads(copy):
    for weights in copy.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ValueError, match=r"holds no \*.safetensors file"):
        load_tunix_model(copy)


def test_the_cli_prints_one_sentence_and_exits_2(copy, capsys):
    config = copy / "config.json"
    config.write_text(config.read_text()[:2])
    assert cli.main(["check", "--model-path", str(copy)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("check:")]
    assert err == [
        f"sgl-jax-rollout: error: {config} is not valid JSON: Expecting property name "
        "enclosed in double quotes at line 2, column 1"
    ]
    without_layers = copy.parent / "other"
    shutil.copytree(copy, without_layers)
    (without_layers / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert cli.main(["plan", "--model-path", str(without_layers), "--preset", "v5e-8"]) == 2
    assert "has no 'num_attention_heads', which a qwen3 model needs" in capsys.readouterr().err


def test_truncated_weights_are_one_sentence_from_check_and_demo(copy, capsys):
    """A `model.safetensors` cut in half (a broken download): `check` and `demo` name the
    file, the tensor and the cause, and exit 2, before tunix or the engine loads anything."""
    (weights,) = copy.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for argv in (["check"], ["demo", "--steps", "1"]):
        assert cli.main([*argv, "--model-path", str(copy)]) == 2
        err = capsys.readouterr().err
        assert f"error: {weights} is not a whole safetensors file: tensor '" in err, err
        assert "the file is truncated" in err and "reshape" not in err


@pytest.mark.engine
def test_the_engine_refuses_a_broken_directory_before_it_starts(copy):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.rollout import SglangJaxRollout

    without(copy, "vocab_size")
    with pytest.raises(ValueError, match=r"config.json has no 'vocab_size', which a qwen3 model"):
        SglangJaxRollout(model_path=copy)
    assert patches.current() is None


def test_a_dtype_casts_the_weights_and_sets_qwens_compute_dtype(tiny_dir):
    """`load_tunix_model(dtype=)`: every weight in it, and tunix's Qwen config computing in it
    (its default is float32 whatever the weights are); without, the weights as stored."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def dtypes(model):
        return {leaf.dtype for leaf in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))}

    stored = load_tunix_model(tiny_dir)
    assert dtypes(stored) == {jnp.dtype(jnp.float32)}
    bf16 = load_tunix_model(tiny_dir, dtype=jnp.bfloat16)
    assert dtypes(bf16) == {jnp.dtype(jnp.bfloat16)}
    assert bf16.config.dtype == jnp.bfloat16 and bf16.config.param_dtype == jnp.bfloat16
    ids = jnp.ones((1, 4), jnp.int32)
    logits, _ = bf16(ids, jnp.arange(4)[None], None, jnp.ones((1, 4, 4), bool))
    assert jnp.dtype(logits.dtype) == jnp.float32  # tunix returns float32 logits of bfloat16
