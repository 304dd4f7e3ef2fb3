"""The built-in tiny model: deterministic files, a working tokenizer, loadable by tunix with
weights that round-trip bit for bit, and next-token distributions far from uniform."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from sgl_jax_rollout.tiny_model import make_tiny_model

PROMPTS = [
    "The answer is",
    "Call the search tool with number",
    "café über 日本語 and then",
    "<|im_start|>user\nAdd five and seven<|im_end|>\n<|im_start|>assistant\n<think>",
    "Where did we find the water",
    "x² ±0.5 → result",
]


def _digest(directory) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen3", arch="qwen3", seed=0)


def test_same_seed_same_bytes_other_seed_other_weights(qwen3_dir, tmp_path):
    again = make_tiny_model(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(qwen3_dir)
    other = make_tiny_model(tmp_path / "other", seed=1)
    assert _digest(other)["model.safetensors"] != _digest(qwen3_dir)["model.safetensors"]


def test_tokenizer_special_ids_template_and_multibyte_round_trip(qwen3_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_dir))
    config = json.loads((qwen3_dir / "config.json").read_text())
    assert len(tok) == config["vocab_size"]
    ids = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}
    assert len(ids) == 3 and None not in ids
    assert tok.eos_token_id == config["eos_token_id"]
    for name in ("<think>", "</think>"):
        assert len(tok.encode(name, add_special_tokens=False)) == 1
    assert tok.convert_tokens_to_ids("<think>") == config["think_start_token_id"]
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    text = "café 日本語 🙂 call(x=5)"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    gen = json.loads((qwen3_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.eos_token_id] and gen["pad_token_id"] == tok.pad_token_id


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_other_architectures_have_their_tensors(arch, tmp_path):
    directory = make_tiny_model(tmp_path / arch, arch=arch)
    tensors = load_file(str(directory / "model.safetensors"))
    assert ("model.layers.0.self_attn.q_proj.bias" in tensors) == (arch == "qwen2")
    assert "model.layers.0.self_attn.q_norm.weight" not in tensors
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == arch


def _expected_tunix_leaves(tensors: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """HF tensors in tunix's qwen3 layout, written from the layouts, not from tunix's code."""
    heads, kv, hd, emb = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.embed_dim
    out = {
        "embedder.input_embedding": tensors["model.embed_tokens.weight"],
        "final_norm.w": tensors["model.norm.weight"],
        "lm_head.w": tensors["lm_head.weight"].T,
    }
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[q + "attn.q_proj.w"] = tensors[p + "self_attn.q_proj.weight"].T.reshape(emb, heads, hd)
        out[q + "attn.k_proj.w"] = tensors[p + "self_attn.k_proj.weight"].T.reshape(emb, kv, hd)
        out[q + "attn.v_proj.w"] = tensors[p + "self_attn.v_proj.weight"].T.reshape(emb, kv, hd)
        out[q + "attn.o_proj.w"] = tensors[p + "self_attn.o_proj.weight"].T.reshape(heads, hd, emb)
        out[q + "attn.q_norm.w"] = tensors[p + "self_attn.q_norm.weight"]
        out[q + "attn.k_norm.w"] = tensors[p + "self_attn.k_norm.weight"]
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[q + f"mlp.{name}.kernel"] = tensors[p + f"mlp.{name}.weight"].T
        out[q + "input_layernorm.w"] = tensors[p + "input_layernorm.weight"]
        out[q + "post_attention_layernorm.w"] = tensors[p + "post_attention_layernorm.weight"]
    return out


@pytest.fixture(scope="module")
def tunix_qwen3(qwen3_dir):
    from tunix_adapter.models import load_tunix_model

    return load_tunix_model(qwen3_dir)


def test_tunix_loader_reads_weights_bit_for_bit(qwen3_dir, tunix_qwen3):
    from flax import nnx

    tensors = load_file(str(qwen3_dir / "model.safetensors"))
    expected = _expected_tunix_leaves(tensors, tunix_qwen3.config)
    leaves = {
        ".".join(str(k) for k in path): np.asarray(value)
        for path, value in nnx.to_flat_state(nnx.state(tunix_qwen3, nnx.Param))
    }
    assert sorted(leaves) == sorted(expected)
    for name, want in expected.items():
        assert leaves[name].dtype == want.dtype, name
        np.testing.assert_array_equal(leaves[name], want, err_msg=name)


def test_next_token_entropy_is_far_from_uniform(qwen3_dir, tunix_qwen3):
    import jax
    import jax.numpy as jnp
    from transformers import AutoTokenizer
    from tunix.rl import common

    tok = AutoTokenizer.from_pretrained(str(qwen3_dir))
    encoded = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    width = max(map(len, encoded))
    tokens = np.full((len(encoded), width), tok.pad_token_id, np.int32)
    for i, ids in enumerate(encoded):
        tokens[i, width - len(ids) :] = ids
    mask = jnp.asarray(tokens != tok.pad_token_id)
    logits, _ = tunix_qwen3(
        jnp.asarray(tokens),
        common.build_positions_from_mask(mask),
        None,
        common.make_causal_attn_mask(mask),
    )
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), np.float64)
    real = np.asarray(mask)
    entropy = -(np.exp(logp) * logp).sum(-1)[real]
    ratio = entropy.mean() / np.log(logits.shape[-1])
    assert 0.2 <= ratio <= 0.8, f"mean entropy is {ratio:.2%} of log V"
    assert entropy.std() > 0.1, "entropy should vary across positions"
