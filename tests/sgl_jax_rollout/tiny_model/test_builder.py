"""The built-in tiny model: deterministic files, a working tokenizer, loadable by tunix with
weights that round-trip bit for bit, and next-token distributions far from uniform."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from sgl_jax_rollout.tiny_model import make_tiny_model
from sgl_jax_rollout.tiny_model.builder import DEFAULT_VOCAB

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


def assert_next_token_entropy_far_from_uniform(model, model_dir) -> None:
    """The trainer model's next-token entropy on PROMPTS: 20-80% of log V, and varied."""
    import jax
    import jax.numpy as jnp
    from transformers import AutoTokenizer

    from sgl_jax_rollout import tunix_compat

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    encoded = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    width = max(map(len, encoded))
    tokens = np.full((len(encoded), width), tok.pad_token_id, np.int32)
    for i, ids in enumerate(encoded):
        tokens[i, width - len(ids) :] = ids
    mask = jnp.asarray(tokens != tok.pad_token_id)
    logits, _ = model(
        jnp.asarray(tokens),
        tunix_compat.build_positions_from_mask(mask),
        None,
        tunix_compat.make_causal_attn_mask(mask),
    )
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), np.float64)
    entropy = -(np.exp(logp) * logp).sum(-1)[np.asarray(mask)]
    ratio = entropy.mean() / np.log(logits.shape[-1])
    assert 0.2 <= ratio <= 0.8, f"mean entropy is {ratio:.2%} of log V"
    assert entropy.std() > 0.1, "entropy should vary across positions"


def test_next_token_entropy_is_far_from_uniform(qwen3_dir, tunix_qwen3):
    assert_next_token_entropy_far_from_uniform(tunix_qwen3, qwen3_dir)


# --- make_tiny_model(like=NAME): a real checkpoint's config features at the tiny sizes ---

# Written from the checkpoints' own config.json / generation_config.json, not from the builder
# (head_dim: the config's, else hidden_size / num_attention_heads).
LLAMA3_ROPE = {
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
REAL = {
    "qwen3-0.6b": (
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "head_dim": 128,
            "tie_word_embeddings": True,
            "rope_theta": 1000000,
            "rope_scaling": None,
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            "use_sliding_window": False,
        },
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "do_sample": True},
    ),
    "qwen3-8b": (
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "head_dim": 128,
            "tie_word_embeddings": False,
            "rope_theta": 1000000,
            "rope_scaling": None,
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            "use_sliding_window": False,
        },
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "do_sample": True},
    ),
    # Qwen/Qwen3-30B-A3B's config.json, its MoE keys at their real values but the experts'
    # width (768 there).
    "qwen3-30b-a3b": (
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "head_dim": 128,
            "tie_word_embeddings": False,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            "use_sliding_window": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 96,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        },
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "do_sample": True},
    ),
    "qwen2.5-1.5b-instruct": (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "head_dim": 128,
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "use_sliding_window": False,
        },
        {
            "do_sample": True,
            "repetition_penalty": 1.1,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
        },
    ),
    "llama-3.1-8b": (
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "head_dim": 128,
            "tie_word_embeddings": False,
            "rope_theta": 500000.0,
            "rope_scaling": {"factor": 8.0, **LLAMA3_ROPE},
            "rms_norm_eps": 1e-5,
            "attention_bias": False,
            "mlp_bias": False,
        },
        {"temperature": 0.6, "top_p": 0.9, "do_sample": True},
    ),
    "llama-3.2-1b": (
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "head_dim": 64,
            "tie_word_embeddings": True,
            "rope_theta": 500000.0,
            "rope_scaling": {"factor": 32.0, **LLAMA3_ROPE},
            "rms_norm_eps": 1e-5,
            "attention_bias": False,
            "mlp_bias": False,
        },
        {"temperature": 0.6, "top_p": 0.9, "do_sample": True},
    ),
    "gemma-2-2b-it": (
        {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "head_dim": 256,
            "tie_word_embeddings": True,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 256,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "torch_dtype": "float32",
            "eos_token_id": [1, 107],
            "pad_token_id": 0,
            "bos_token_id": 2,
        },
        {"bos_token_id": 2, "eos_token_id": [1, 107], "pad_token_id": 0},
    ),
}
TINY_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def like_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("like")
    return {name: make_tiny_model(root / name, like=name) for name in REAL}


def _safetensors_dtypes(path) -> set[str]:
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_presets_are_exported():
    from sgl_jax_rollout.tiny_model import LIKE_PRESETS

    assert sorted([*REAL, GEMMA3, GEMMA3_4B, GEMMA4]) == sorted(LIKE_PRESETS)


# google/gemma-3-1b-it's config.json and generation_config.json (window 512 there, 256 in the
# replica), written from the checkpoint's values.
GEMMA3 = "gemma-3-1b-it"
GEMMA3_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "vocab_size": 262144,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-6,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
}
GEMMA3_GENERATION = {
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "do_sample": True,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
    "top_k": 64,
    "top_p": 0.95,
}


def test_gemma3_replica_keeps_the_checkpoints_config(tmp_path):
    """Gemma 2's layout with q / k norms over head_dim, one KV head, five windowed layers to
    one full one, `<end_of_turn>` at 106 (107 in Gemma 2), tunix loads it with varied
    next-token distributions."""
    from transformers import AutoTokenizer

    from tunix_adapter.models import load_tunix_model

    directory = make_tiny_model(tmp_path / "g3", like=GEMMA3)
    config = json.loads((directory / "config.json").read_text())
    for key, value in GEMMA3_CONFIG.items():
        assert config[key] == value and type(config[key]) is type(value), key
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert config["sliding_window"] < 300 and config["num_hidden_layers"] == 6
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation == GEMMA3_GENERATION
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert len(tokenizer) == config["vocab_size"]
    # the filled ids decode to their names and no text encodes to them
    assert tokenizer.decode([262143, 200000]) == "<unused262143><unused200000>"
    assert max(tokenizer("say <unused200000> five times café").input_ids) < DEFAULT_VOCAB
    named = ["<pad>", "<eos>", "<bos>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    assert tokenizer.convert_tokens_to_ids(named) == [0, 1, 2, 4, 105, 106]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert (
        rendered == "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n"
    )

    tensors = load_file(str(directory / "model.safetensors"))
    p = "model.layers.5."
    assert tensors[p + "self_attn.q_norm.weight"].shape == (256,)
    assert tensors[p + "self_attn.k_proj.weight"].shape == (256, config["hidden_size"])
    assert p + "pre_feedforward_layernorm.weight" in tensors and "lm_head.weight" not in tensors
    assert _safetensors_dtypes(directory / "model.safetensors") == {"BF16"}
    again = make_tiny_model(tmp_path / "again", like=GEMMA3)
    assert _digest(again) == _digest(directory)
    assert_next_token_entropy_far_from_uniform(load_tunix_model(directory), directory)


# google/gemma-4-31B-it's config.json (text_config) and generation_config.json, written from
# the checkpoint's values (window 1,024 there, 256 in the replica), not from the builder.
# google/gemma-3-4b-it's config.json keys, and those its text_config lists (the replica also
# names its head counts and vocabulary, whose tiny sizes are not transformers' defaults).
GEMMA3_4B = "gemma-3-4b-it"
GEMMA3_4B_KEYS = {
    *("architectures", "boi_token_index", "eoi_token_index", "eos_token_id"),
    *("image_token_index", "initializer_range", "mm_tokens_per_image", "model_type"),
    *("text_config", "torch_dtype", "vision_config"),
}
GEMMA3_4B_TEXT_KEYS = {
    *("hidden_size", "intermediate_size", "model_type", "num_hidden_layers", "rope_scaling"),
    *("sliding_window", "num_attention_heads", "num_key_value_heads", "vocab_size"),
}


def test_the_multimodal_gemma3_replica_keeps_the_checkpoints_layout(tmp_path):
    """`Gemma3ForConditionalGeneration` (model_type gemma3): the language model's config under
    `text_config` with only the keys the checkpoint lists there and no dtype (the top level
    holds it), its weights under `language_model.model.`, a SigLIP vision tower and the
    projector beside them under HF's names; the same bytes again."""
    from safetensors.numpy import load_file

    directory = make_tiny_model(tmp_path / "g3mm", like=GEMMA3_4B)
    config = json.loads((directory / "config.json").read_text())
    assert set(config) == GEMMA3_4B_KEYS and set(config["text_config"]) == GEMMA3_4B_TEXT_KEYS
    assert config["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert (config["model_type"], config["text_config"]["model_type"]) == ("gemma3", "gemma3_text")
    assert config["text_config"]["rope_scaling"] == {"factor": 8.0, "rope_type": "linear"}
    assert (config["torch_dtype"], config["eos_token_id"]) == ("bfloat16", [1, 106])
    assert config["vision_config"]["model_type"] == "siglip_vision_model"
    tensors = load_file(str(directory / "model.safetensors"))
    text = [n for n in tensors if n.startswith("language_model.model.")]
    other = sorted({n.split(".")[0] for n in tensors} - {"language_model"})
    assert other == ["multi_modal_projector", "vision_tower"]
    assert tensors["language_model.model.layers.0.self_attn.k_norm.weight"].shape == (256,)
    assert tensors["language_model.model.layers.0.self_attn.k_proj.weight"].shape == (512, 64)
    assert len(text) == 2 + 6 * 13  # embedding, final norm; 13 tensors a layer, 6 layers
    again = make_tiny_model(tmp_path / "again", like=GEMMA3_4B)
    assert _digest(again) == _digest(directory)


GEMMA4 = "gemma-4-31b-it"
GEMMA4_TEXT = {
    "model_type": "gemma4_text",
    "head_dim": 256,
    "global_head_dim": 512,
    "attention_k_eq_v": True,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
    "final_logit_softcapping": 30.0,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_bias": False,
    "enable_moe_block": False,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "tie_word_embeddings": True,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}
GEMMA4_GENERATION = {
    "bos_token_id": 2,
    "eos_token_id": [1, 106, 50],
    "pad_token_id": 0,
    "do_sample": True,
    "temperature": 1.0,
    "top_k": 64,
    "top_p": 0.95,
}


def test_gemma4_replica_keeps_the_checkpoints_layout(tmp_path):
    """Gemma 4's own layout: the language model's config under `text_config`, its weights
    under `model.language_model.`, five windowed layers to one full one, the full layers'
    keys their values (no `v_proj`) with a quarter of the KV heads, and `<turn|>` at 106."""
    from transformers import AutoTokenizer

    directory = make_tiny_model(tmp_path / "g4", like=GEMMA4)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert config["model_type"] == "gemma4" and config["eos_token_id"] == [1, 106]
    text = config["text_config"]
    for key, value in GEMMA4_TEXT.items():
        assert text[key] == value, key
    kinds = text["layer_types"]
    assert kinds == ["sliding_attention"] * 5 + ["full_attention"] and text["sliding_window"] < 600
    assert text["num_global_key_value_heads"] * 4 <= max(4, text["num_key_value_heads"])
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation == GEMMA4_GENERATION
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert len(tokenizer) == text["vocab_size"]
    named = ["<pad>", "<eos>", "<bos>", "<|tool_response>", "<|turn>", "<turn|>"]
    assert tokenizer.convert_tokens_to_ids(named) == [0, 1, 2, 50, 105, 106]
    assert tokenizer("hi").input_ids[0] == 2

    tensors = load_file(str(directory / "model.safetensors"))
    assert all(name.startswith("model.language_model.") for name in tensors)
    p = "model.language_model.layers."
    full, windowed = p + "5.self_attn.", p + "0.self_attn."
    assert windowed + "v_proj.weight" in tensors and full + "v_proj.weight" not in tensors
    assert tensors[full + "q_norm.weight"].shape == (512,)
    assert tensors[windowed + "k_proj.weight"].shape[0] == text["num_key_value_heads"] * 256
    assert tensors[full + "k_proj.weight"].shape[0] == text["num_global_key_value_heads"] * 512
    assert _safetensors_dtypes(directory / "model.safetensors") == {"BF16"}
    again = make_tiny_model(tmp_path / "again", like=GEMMA4)
    assert _digest(again) == _digest(directory)


@pytest.mark.parametrize("name", sorted(REAL))
def test_like_config_generation_config_and_tensors(name, like_dirs):
    directory = like_dirs[name]
    want_config, want_generation = REAL[name]
    config = json.loads((directory / "config.json").read_text())
    for key, value in {**TINY_SIZES, **want_config}.items():
        assert key in config, key
        assert config[key] == value and type(config[key]) is type(value), key
    assert config["max_position_embeddings"] >= 2048
    if config.get("rope_scaling"):  # HF warns unless the original length is below the max
        original = config["rope_scaling"]["original_max_position_embeddings"]
        assert config["max_position_embeddings"] > original
    generation = json.loads((directory / "generation_config.json").read_text())
    for key, value in want_generation.items():
        assert generation[key] == value, key

    tensors = load_file(str(directory / "model.safetensors"))
    assert ("lm_head.weight" in tensors) == (not config["tie_word_embeddings"])
    assert ("model.layers.0.self_attn.q_proj.bias" in tensors) == (config["model_type"] == "qwen2")
    assert ("model.layers.1.self_attn.k_norm.weight" in tensors) == (
        config["model_type"] in ("qwen3", "qwen3_moe")
    )
    moe = config["model_type"] == "qwen3_moe"  # a router and stacked experts, no dense MLP
    assert ("model.layers.1.mlp.up_proj.weight" in tensors) == (not moe)
    if moe:
        p, width, hidden = "model.layers.1.mlp.", config["moe_intermediate_size"], 64
        assert tensors[p + "gate.weight"].shape == (config["num_experts"], hidden)
        last = f"{p}experts.{config['num_experts'] - 1}."
        assert tensors[last + "gate_proj.weight"].shape == (width, hidden)
        assert tensors[last + "down_proj.weight"].shape == (hidden, width)
        assert f"{p}experts.{config['num_experts']}.up_proj.weight" not in tensors
    assert ("model.layers.1.pre_feedforward_layernorm.weight" in tensors) == (
        config["model_type"] == "gemma2"
    )
    stored = {"bfloat16": "BF16", "float32": "F32"}[config["torch_dtype"]]
    assert _safetensors_dtypes(directory / "model.safetensors") == {stored}


@pytest.mark.parametrize("name", sorted(REAL))
def test_like_special_ids_match_the_tokenizer(name, like_dirs):
    from transformers import AutoTokenizer

    directory = like_dirs[name]
    tok = AutoTokenizer.from_pretrained(str(directory))
    config = json.loads((directory / "config.json").read_text())
    generation = json.loads((directory / "generation_config.json").read_text())
    assert len(tok) == config["vocab_size"]
    assert config["bos_token_id"] == tok.bos_token_id == generation["bos_token_id"]
    eos = generation["eos_token_id"]
    if name.startswith("gemma"):  # <eos> and <end_of_turn> at Gemma's ids; BOS on every text
        end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
        assert config["eos_token_id"] == eos == [tok.eos_token_id, end_of_turn] == [1, 107]
        assert tok("hi").input_ids[0] == tok.bos_token_id == 2
        chat = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True
        )
        assert chat.count(tok.bos_token_id) == 1
        return
    assert config["eos_token_id"] == tok.eos_token_id
    if name.startswith("qwen"):  # Qwen ships [<|im_end|>, <|endoftext|>] and a pad id
        assert eos == [tok.eos_token_id, tok.bos_token_id]
        assert generation["pad_token_id"] == tok.pad_token_id
    else:  # Llama 3 base ships one eos id and no pad id
        assert eos == tok.eos_token_id and "pad_token_id" not in generation


@pytest.mark.parametrize("name", sorted(REAL))
def test_like_same_seed_same_bytes(name, like_dirs, tmp_path):
    again = make_tiny_model(tmp_path / "again", like=name, seed=0)
    assert _digest(again) == _digest(like_dirs[name])
    other = make_tiny_model(tmp_path / "other", like=name, seed=1)
    assert _digest(other)["model.safetensors"] != _digest(again)["model.safetensors"]


def test_like_dtype_override(tmp_path):
    directory = make_tiny_model(tmp_path / "f32", like="llama-3.2-1b", dtype="float32")
    assert json.loads((directory / "config.json").read_text())["torch_dtype"] == "float32"
    assert _safetensors_dtypes(directory / "model.safetensors") == {"F32"}
    with pytest.raises(ValueError, match="dtype"):
        make_tiny_model(tmp_path / "bad", like="llama-3.2-1b", dtype="float16")


def test_like_unknown_name_and_arch_with_like_raise(tmp_path):
    with pytest.raises(ValueError, match="qwen3-0.6b") as err:
        make_tiny_model(tmp_path / "x", like="qwen9-1t")
    for name in REAL:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="not both"):
        make_tiny_model(tmp_path / "y", arch="qwen3", like="qwen3-0.6b")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_real_size_takes_the_checkpoint_sizes_and_pads_the_vocabulary(tmp_path):
    # One layer in bfloat16 keeps the file small (the 151,936 x 1,024 embedding: 311 MB).
    directory = make_tiny_model(tmp_path / "real", like="qwen3-0.6b", real_size=True, layers=1)
    config = json.loads((directory / "config.json").read_text())
    sizes = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads")}
    assert sizes == {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16}
    assert config["num_key_value_heads"] == 8 and config["num_hidden_layers"] == 1
    assert config["vocab_size"] == 151936 and config["tie_word_embeddings"] is True
    with open(directory / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["model.embed_tokens.weight"]["shape"] == [151936, 1024]
    assert "model.layers.1.mlp.up_proj.weight" not in header
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) < 151936  # ids past the tokenizer are padding


def test_real_size_errors_name_the_cause(tmp_path):
    with pytest.raises(ValueError, match=r"real_size needs like= one of \['qwen3-0.6b'\]"):
        make_tiny_model(tmp_path / "a", like="llama-3.2-1b", real_size=True)
    with pytest.raises(ValueError, match=r"layers must be an integer in \[1, 28\]"):
        make_tiny_model(tmp_path / "b", like="qwen3-0.6b", real_size=True, layers=29)
    with pytest.raises(ValueError, match="real_size models only"):
        make_tiny_model(tmp_path / "c", layers=2)
    assert not any((tmp_path / d).exists() for d in "abc")


def test_plain_model_bytes_are_pinned(qwen3_dir):
    """The plain model (no `like`) is unchanged: json and weights byte for byte."""
    digest = _digest(qwen3_dir)
    assert digest["config.json"].startswith("cf04d996c24a0789")
    assert digest["generation_config.json"].startswith("54d09a44e398e98f")
    assert digest["model.safetensors"].startswith("9607ea64c620da2e")


def test_cli_make_tiny_model_like(tmp_path, capsys):
    from sgl_jax_rollout_apps.cli import main

    assert main(["make-tiny-model", str(tmp_path / "l"), "--like", "llama-3.2-1b"]) == 0
    config = json.loads((tmp_path / "l" / "config.json").read_text())
    assert config["rope_scaling"]["factor"] == 32.0 and config["tie_word_embeddings"] is True
    assert "llama-3.2-1b" in capsys.readouterr().out
    assert main(["make-tiny-model", str(tmp_path / "u"), "--like", "nope"]) == 2
    assert "qwen3-0.6b" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["make-tiny-model", str(tmp_path / "b"), "--arch", "qwen3", "--like", "qwen3-8b"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("name", sorted(REAL))
def test_tunix_loads_like_presets_with_non_uniform_next_tokens(name, like_dirs):
    from flax import nnx

    from tunix_adapter.models import load_tunix_model

    directory = like_dirs[name]
    model = load_tunix_model(directory)
    leaves = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    tied = json.loads((directory / "config.json").read_text())["tie_word_embeddings"]
    assert ("lm_head.w" in leaves) == (not tied)

    assert_next_token_entropy_far_from_uniform(model, directory)
