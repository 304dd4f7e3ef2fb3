"""The Qwen2 / Qwen2.5 family (`--arch qwen2`, `--like qwen2.5-1.5b-instruct`).

Owns its preset, its config keys and its q / k / v bias tensors (Qwen2 has no
`attention_bias` key: the biases are always there).

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.tiny_model.families.qwen3 import QWEN_BASE
from sgl_jax_rollout.tiny_model.family import Family, LikePreset, Normal, NormWeight, TinyShape

PRESETS = {
    "qwen2.5-1.5b-instruct": LikePreset(
        arch="qwen2",
        hf_repo="Qwen/Qwen2.5-1.5B-Instruct",
        config={**QWEN_BASE, "rope_theta": 1000000.0, "tie_word_embeddings": True},
        generation={
            "do_sample": True,
            "repetition_penalty": 1.1,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
        },
        eos_with_bos=True,
        head_dim=128,
    ),
}


def tiny_config(s: TinyShape) -> dict[str, Any]:
    return {"use_sliding_window": False, "sliding_window": None, "max_window_layers": s.layers}


def like_config(s: TinyShape, max_positions: int, ids: dict[str, Any]) -> dict[str, Any]:
    return {
        "sliding_window": max_positions,
        "use_sliding_window": False,
        "max_window_layers": s.layers,
    }


def qkv_biases(prefix: str, s: TinyShape, normal: Normal, norm_weight: NormWeight) -> dict:
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {
        prefix + "self_attn.q_proj.bias": normal(q, std=0.1),
        prefix + "self_attn.k_proj.bias": normal(kv, std=0.1),
        prefix + "self_attn.v_proj.bias": normal(kv, std=0.1),
    }


FAMILY = Family(
    arch="qwen2",
    architecture="Qwen2ForCausalLM",
    model_type="qwen2",
    presets=PRESETS,
    tiny_config=tiny_config,
    like_config=like_config,
    layer_tensors=qkv_biases,
)
