"""The Gemma 4 family: the replica's preset, config.json and weights (`--like gemma-4-31b-it`).

Owns its preset, `config`, `generation` and `weights` (which `own_layout` calls for `builder`).
Gemma 4's checkpoints differ from the other families' in layout, so they are written here
rather than in `builder`'s shared path: the language model's config nests under `text_config`
of a `Gemma4ForConditionalGeneration`, the weights sit under `model.language_model.`, and the
two kinds of layer have their own attention shapes.

What google/gemma-4-31B-it's config.json sets, kept at tiny sizes: five windowed layers to one
full one (the last layer full), `head_dim` 256 on the windowed layers and `global_head_dim` 512
on the full ones, fewer KV heads on the full layers (`num_global_key_value_heads`, a quarter of
the windowed layers' there) whose keys are their values (`attention_k_eq_v`: no `v_proj`),
RoPE base 10,000 on the window's layers and "proportional" RoPE (base 1e6, a quarter of the
dimensions rotated) on the full ones, q / k norms, a per-layer scalar, final-logit
soft-capping 30, tanh GeLU, tied embeddings, `<eos>` and `<turn|>` stopping. The window is 256
(1,024 in the checkpoint), shorter than the tests' prompts. Norm weights multiply (`x * w`,
not Gemma 2's `x * (1 + w)`).

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sgl_jax_rollout.tiny_model.family import Family, LikePreset, TinyShape
from sgl_jax_rollout.tiny_model.tokenizer import GEMMA4

ARCHITECTURE = "Gemma4ForConditionalGeneration"
PREFIX = "model.language_model."
WINDOW = 256
PERIOD = 6  # five windowed layers, then a full one
HEAD_DIM, GLOBAL_HEAD_DIM = 256, 512


def layer_types(layers: int) -> list[str]:
    return [
        "full_attention" if (i + 1) % PERIOD == 0 else "sliding_attention" for i in range(layers)
    ]


def config(shape: Any, vocab: int, ids: dict[str, int], max_positions: int) -> dict[str, Any]:
    """config.json of the replica at `shape`'s sizes (`shape.layers` >= 6 holds one full
    layer; `shape.kv_heads` KV heads on the windowed layers, a quarter, at least one, on the
    full ones)."""
    stops = [ids["eos"], ids["end_of_turn"]]
    text = {
        "model_type": "gemma4_text",
        "vocab_size": vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "num_global_key_value_heads": max(1, shape.kv_heads // 4),
        "head_dim": HEAD_DIM,
        "global_head_dim": GLOBAL_HEAD_DIM,
        "attention_k_eq_v": True,
        "layer_types": layer_types(shape.layers),
        "sliding_window": WINDOW,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
            },
        },
        "final_logit_softcapping": 30.0,
        "rms_norm_eps": 1e-06,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "enable_moe_block": False,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_bidirectional_attention": "vision",
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": True,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
    }
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": None,
        "audio_config": None,
        "tie_word_embeddings": True,
        "bos_token_id": ids["bos"],
        "eos_token_id": stops,
        "pad_token_id": ids["pad"],
    }


def generation(ids: dict[str, int], tool_response: int) -> dict[str, Any]:
    """generation_config.json: the checkpoint's stops (`<eos>`, `<turn|>`, `<|tool_response>`)
    and sampling defaults."""
    return {
        "bos_token_id": ids["bos"],
        "pad_token_id": ids["pad"],
        "eos_token_id": [ids["eos"], ids["end_of_turn"], tool_response],
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 64,
        "top_p": 0.95,
    }


def weights(text: dict[str, Any], rng: np.random.Generator, embed_std: float) -> dict:
    """Seeded float32 weights for config `text` (its `text_config`), under Gemma 4's names."""

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def gain(size: int, center: float = 1.0) -> np.ndarray:
        return (center + rng.standard_normal(size) * 0.1).astype(np.float32)

    hidden, inter, heads = (
        text["hidden_size"],
        text["intermediate_size"],
        text["num_attention_heads"],
    )
    tensors = {PREFIX + "embed_tokens.weight": normal(text["vocab_size"], hidden, std=embed_std)}
    for i, kind in enumerate(text["layer_types"]):
        p = f"{PREFIX}layers.{i}."
        windowed = kind == "sliding_attention"
        head_dim = text["head_dim"] if windowed else text["global_head_dim"]
        kv = (
            text["num_key_value_heads"] if windowed else text["num_global_key_value_heads"]
        ) * head_dim
        q = heads * head_dim
        # Embeddings are scaled by sqrt(hidden) and each block's output is normalised: post
        # norms of gain 4 keep the blocks from being drowned by the embedding.
        tensors[p + "input_layernorm.weight"] = gain(hidden)
        tensors[p + "post_attention_layernorm.weight"] = gain(hidden, 4.0)
        tensors[p + "pre_feedforward_layernorm.weight"] = gain(hidden)
        tensors[p + "post_feedforward_layernorm.weight"] = gain(hidden, 4.0)
        tensors[p + "layer_scalar"] = gain(1)
        tensors[p + "self_attn.q_proj.weight"] = normal(q, hidden, std=hidden**-0.5)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv, hidden, std=hidden**-0.5)
        if windowed:  # the full layers' keys are their values
            tensors[p + "self_attn.v_proj.weight"] = normal(kv, hidden, std=hidden**-0.5)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, q, std=q**-0.5)
        # Gemma 4 scales queries by 1, not head_dim ** -0.5: the checkpoint's q / k norms carry
        # the scale (scores of unit-RMS q and k would have a std of sqrt(head_dim), a softmax
        # close to one-hot whose float32 rounding moves logprobs by 1e-3).
        tensors[p + "self_attn.q_norm.weight"] = gain(head_dim, head_dim**-0.25)
        tensors[p + "self_attn.k_norm.weight"] = gain(head_dim, head_dim**-0.25)
        tensors[p + "mlp.gate_proj.weight"] = normal(inter, hidden, std=hidden**-0.5)
        tensors[p + "mlp.up_proj.weight"] = normal(inter, hidden, std=hidden**-0.5)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, inter, std=inter**-0.5)
    tensors[PREFIX + "norm.weight"] = gain(hidden)
    return tensors


def own_layout(
    shape: TinyShape,
    vocab: int,
    ids: dict[str, int],
    max_positions: int,
    dtype: str,
    tokenizer: Any,
    seed: int,
) -> tuple[dict, dict, dict]:
    """config.json (`dtype` in its `text_config` too), generation_config.json and the seeded
    weights of the replica."""
    full = config(shape, vocab, ids, max_positions)
    full["text_config"]["torch_dtype"] = dtype
    stops = generation(ids, tokenizer.token_to_id("<|tool_response>"))
    rng = np.random.default_rng(seed)
    return full, stops, weights(full["text_config"], rng, shape.lm_head_std)


FAMILY = Family(
    arch="gemma4",
    architecture=ARCHITECTURE,
    model_type="gemma4",
    presets={
        "gemma-4-31b-it": LikePreset(
            arch="gemma4",
            hf_repo="google/gemma-4-31B-it",
            config={"torch_dtype": "bfloat16"},  # the rest: `config`
            generation={},
            eos_with_bos=False,
            head_dim=HEAD_DIM,
            max_positions=8192,
        ),
    },
    vocabulary=GEMMA4,
    like_only=True,
    min_layers=PERIOD,  # one full layer at least
    own_layout=own_layout,
)
