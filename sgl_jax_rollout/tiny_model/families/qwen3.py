"""The Qwen3 family (`--arch qwen3`, the default; `--like qwen3-0.6b`, `qwen3-8b`).

Owns Qwen3's presets and config keys, its q / k RMSNorm tensors, and the config values and
generation defaults that the other Qwen replicas (`qwen2`, `qwen3_moe`) share with it.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.tiny_model.family import Family, LikePreset, Normal, NormWeight, TinyShape

QWEN_BASE = {"rms_norm_eps": 1e-06, "torch_dtype": "bfloat16"}
QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}

PRESETS = {
    "qwen3-0.6b": LikePreset(
        arch="qwen3",
        hf_repo="Qwen/Qwen3-0.6B",
        config={**QWEN_BASE, "rope_theta": 1000000, "tie_word_embeddings": True},
        generation=QWEN3_GENERATION,
        eos_with_bos=True,
        head_dim=128,
        # Qwen/Qwen3-0.6B config.json; weights as the tiny model's (random, seeded).
        real=TinyShape(
            hidden=1024,
            intermediate=3072,
            layers=28,
            heads=16,
            kv_heads=8,
            head_dim=128,
            max_positions=40960,
            lm_head_std=0.3 * (64 / 1024) ** 0.5,  # the tiny model's logit scale
        ),
        real_vocab=151936,
    ),
    "qwen3-8b": LikePreset(
        arch="qwen3",
        hf_repo="Qwen/Qwen3-8B",
        config={**QWEN_BASE, "rope_theta": 1000000, "tie_word_embeddings": False},
        generation=QWEN3_GENERATION,
        eos_with_bos=True,
        head_dim=128,
    ),
}


def tiny_config(s: TinyShape) -> dict[str, Any]:
    return {"attention_bias": False}


def like_config(s: TinyShape, max_positions: int, ids: dict[str, Any]) -> dict[str, Any]:
    """q / k RMSNorm (tensors), no biases: a Qwen3 checkpoint's keys."""
    return {
        "attention_bias": False,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": s.layers,
    }


def qk_norms(prefix: str, s: TinyShape, normal: Normal, norm_weight: NormWeight) -> dict:
    return {
        prefix + "self_attn.q_norm.weight": norm_weight(s.head_dim),
        prefix + "self_attn.k_norm.weight": norm_weight(s.head_dim),
    }


FAMILY = Family(
    arch="qwen3",
    architecture="Qwen3ForCausalLM",
    model_type="qwen3",
    presets=PRESETS,
    tiny_config=tiny_config,
    like_config=like_config,
    layer_tensors=qk_norms,
)
