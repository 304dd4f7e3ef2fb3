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


def _header(path):
    length = int.from_bytes(path.read_bytes()[:8], "little")
    return length, json.loads(path.read_bytes()[8 : 8 + length])


def test_a_truncated_or_inconsistent_safetensors_file_is_named_with_its_tensor(copy):
    """A download cut in half used to reach the loaders, which raised numpy's "cannot
    reshape array of size ..."; the header is checked against the data before anything."""
    (weights,) = copy.glob("*.safetensors")
    whole = weights.read_bytes()
    length, header = _header(weights)
    data = len(whole) - 8 - length
    weights.write_bytes(whole[: 8 + length + data // 2])
    with pytest.raises(ValueError) as err:
        check_weights(copy)
    # the first tensor that lies past the half the file keeps
    name, entry = next(
        (k, v)
        for k, v in header.items()
        if k != "__metadata__" and v["data_offsets"][1] > data // 2
    )
    start, end = entry["data_offsets"]
    assert str(err.value) == (
        f"{weights} is not a whole safetensors file: tensor {name!r} ({entry['dtype']} "
        f"{entry['shape']}) lies at bytes [{start}, {end}) of the data, which holds "
        f"{data // 2}: the file is truncated"
    )
    weights.write_bytes(whole[:100])
    with pytest.raises(ValueError, match=r"the header claims \d+ bytes, the file holds 92"):
        check_weights(copy)
    weights.write_bytes(b"\x01")
    with pytest.raises(ValueError, match="fewer than the 8 of the header length"):
        check_weights(copy)
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [*header[name]["shape"], 2]
    text = json.dumps(header).encode()
    weights.write_bytes(len(text).to_bytes(8, "little") + text + whole[8 + length :])
    with pytest.raises(ValueError, match=rf"tensor '{name}' \(F32 .*\) needs \d+ bytes, its"):
        check_weights(copy)


# google/gemma-3-4b-it's config.json, its text_config as the checkpoint lists it.
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
}


def test_a_nested_text_config_is_filled_as_transformers_fills_it_with_the_checkpoints_dtype():
    from sgl_jax_rollout.utils.model_dir import language_config

    text = language_config(GEMMA3_4B)
    heads = (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"])
    assert heads == (8, 4, 256)
    assert (text["vocab_size"], text["query_pre_attn_scalar"]) == (262_208, 256)
    assert (text["rope_theta"], text["rope_local_base_freq"]) == (1_000_000.0, 10_000.0)
    assert (
        text["layer_types"]
        == (["sliding_attention"] * 5 + ["full_attention"]) * 5 + ["sliding_attention"] * 4
    )
    assert (text["sliding_window"], text["rope_scaling"]["factor"]) == (1024, 8.0)
    assert text["tie_word_embeddings"] is True and text["torch_dtype"] == "bfloat16"
    flat = {"model_type": "qwen3", "vocab_size": 5}
    assert language_config(flat) is flat
    # A text model transformers 4.57 does not know (Gemma 4) is taken as written.
    gemma4 = {"text_config": {"model_type": "gemma4_text", "head_dim": 256, "dtype": "bfloat16"}}
    assert language_config(gemma4) == gemma4["text_config"]


def test_the_language_models_prefix_is_read_from_the_safetensors_headers(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from sgl_jax_rollout.utils.model_dir import checkpoint_prefix

    for name, prefix in [("saved", "language_model.model."), ("memory", "model.language_model.")]:
        (tmp_path / name).mkdir()
        tensors = {prefix + "embed_tokens.weight": np.zeros((2, 2), np.float32)}
        save_file(tensors, str(tmp_path / name / "model-00001-of-00001.safetensors"))
        assert checkpoint_prefix(tmp_path / name, "Gemma3ForConditionalGeneration") == prefix
    (tmp_path / "flat").mkdir()
    save_file({"model.embed_tokens.weight": np.zeros(2)}, str(tmp_path / "flat" / "m.safetensors"))
    with pytest.raises(ValueError, match="language_model.model. or model.language_model."):
        checkpoint_prefix(tmp_path / "flat", "Gemma3ForConditionalGeneration")
