"""The Llama 3.x family (`--arch llama`, `--like llama-3.1-8b`, `llama-3.2-1b`).

Owns its presets (llama3 RoPE scaling, Llama 3 base checkpoints' generation defaults) and its
config keys; its tensors are the shared layout's.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.tiny_model.family import Family, LikePreset, TinyShape

_LLAMA_BASE = {"rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}
_LLAMA_GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}


def _llama3_rope_scaling(factor: float) -> dict[str, Any]:
    return {
        "factor": factor,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }


PRESETS = {
    "llama-3.1-8b": LikePreset(
        arch="llama",
        hf_repo="meta-llama/Llama-3.1-8B",
        config={
            **_LLAMA_BASE,
            "rope_scaling": _llama3_rope_scaling(8.0),
            "tie_word_embeddings": False,
        },
        generation=_LLAMA_GENERATION,
        eos_with_bos=False,
        head_dim=128,
        max_positions=16384,
    ),
    "llama-3.2-1b": LikePreset(
        arch="llama",
        hf_repo="meta-llama/Llama-3.2-1B",
        config={
            **_LLAMA_BASE,
            "rope_scaling": _llama3_rope_scaling(32.0),
            "tie_word_embeddings": True,
        },
        generation=_LLAMA_GENERATION,
        eos_with_bos=False,
        head_dim=64,
        max_positions=16384,
    ),
}


def tiny_config(s: TinyShape) -> dict[str, Any]:
    return {"attention_bias": False, "mlp_bias": False, "rope_scaling": None}


def like_config(s: TinyShape, max_positions: int, ids: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}


FAMILY = Family(
    arch="llama",
    architecture="LlamaForCausalLM",
    model_type="llama",
    presets=PRESETS,
    tiny_config=tiny_config,
    like_config=like_config,
)
