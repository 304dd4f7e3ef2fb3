"""The Gemma 2 family (`--arch gemma2`, `--like gemma-2-2b-it`).

Owns its preset, its vocabulary (Gemma's special tokens at Gemma's ids), its config keys and
the norms around each block's feed-forward; its RMSNorm scales by (1 + w).

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.tiny_model.family import Family, LikePreset, Normal, NormWeight, TinyShape
from sgl_jax_rollout.tiny_model.tokenizer import GEMMA

# Gemma scales the input embedding by sqrt(hidden) and normalises each block's output (post
# norms): gains of 4 keep the blocks from being drowned by the embedding, which the tied output
# would otherwise copy (the next token = the current one).
POST_NORM_GAIN = 4.0

PRESETS = {
    "gemma-2-2b-it": LikePreset(
        arch="gemma2",
        hf_repo="google/gemma-2-2b-it",
        config={
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "attention_bias": False,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 256,
            # 4096 in the checkpoint: the replica's window is shorter than the tests' prompts
            # (1,024 tokens), so the alternate layers' window is exercised.
            "sliding_window": 256,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "cache_implementation": "hybrid",
        },
        generation={"cache_implementation": "hybrid"},
        eos_with_bos=False,
        head_dim=256,
        max_positions=8192,
    ),
}


def like_config(s: TinyShape, max_positions: int, ids: dict[str, Any]) -> dict[str, Any]:
    """<eos> and <end_of_turn> stop, <pad> 0 (gemma-2-2b-it's)."""
    return {"eos_token_id": [ids["eos"], ids["end_of_turn"]], "pad_token_id": ids["pad"]}


def feedforward_norms(prefix: str, s: TinyShape, normal: Normal, norm_weight: NormWeight) -> dict:
    """Norms around the feed-forward block too."""
    return {
        prefix + "pre_feedforward_layernorm.weight": norm_weight(s.hidden),
        prefix + "post_feedforward_layernorm.weight": norm_weight(s.hidden, POST_NORM_GAIN),
    }


FAMILY = Family(
    arch="gemma2",
    architecture="Gemma2ForCausalLM",
    model_type="gemma2",
    presets=PRESETS,
    vocabulary=GEMMA,
    like_config=like_config,
    layer_tensors=feedforward_norms,
    norm_plus_one=True,
    post_norm_gain=POST_NORM_GAIN,
)
