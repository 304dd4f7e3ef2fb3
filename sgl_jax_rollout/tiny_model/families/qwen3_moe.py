"""The Qwen3-MoE family (`--like qwen3-30b-a3b` only).

Owns its preset, the replica's mixture of experts (`MOE_EXPERTS`, `MOE_TOP_K`,
`MOE_INTERMEDIATE`) and each layer's router and experts in place of the dense MLP; its
attention is Qwen3's (`qwen3`'s config keys and q / k norms).

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import numpy as np

from sgl_jax_rollout.tiny_model.families.qwen3 import (
    QWEN3_GENERATION,
    QWEN_BASE,
    like_config,
    qk_norms,
)
from sgl_jax_rollout.tiny_model.family import Family, LikePreset, Normal, TinyShape

# The replica's mixture of experts: Qwen3-30B-A3B's 128 experts, 8 per token (where routing
# flips come from: the eighth and ninth are often close), 96 wide (768 there).
MOE_EXPERTS, MOE_TOP_K, MOE_INTERMEDIATE = 128, 8, 96

PRESETS = {
    "qwen3-30b-a3b": LikePreset(
        arch="qwen3_moe",
        hf_repo="Qwen/Qwen3-30B-A3B",
        # Qwen/Qwen3-30B-A3B config.json: every layer sparse, top-k renormalised, no shared
        # expert, 128 experts, 8 per token; 96 wide at the tiny size.
        config={
            **QWEN_BASE,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "num_experts": MOE_EXPERTS,
            "num_experts_per_tok": MOE_TOP_K,
            "moe_intermediate_size": MOE_INTERMEDIATE,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        },
        generation=QWEN3_GENERATION,
        eos_with_bos=True,
        head_dim=128,
    ),
}


def experts(prefix: str, s: TinyShape, normal: Normal) -> dict[str, np.ndarray]:
    """A Qwen3-MoE block's tensors: the router (`gate`, `[experts, hidden]`) and each expert's
    SwiGLU MLP, HF's names and `[out, in]` layout. Router logits have a std of ~0.2, flat as a
    load-balanced router's are, so a token's eighth and ninth experts are often close; the
    experts' outputs are three times an MLP's, so which expert serves a token matters: the
    replica shows what a flipped expert does (bfloat16, routing replay) while float32 sides
    still agree on every choice."""
    hidden, f = s.hidden, MOE_INTERMEDIATE
    tensors = {prefix + "gate.weight": normal(MOE_EXPERTS, hidden, std=0.2 * hidden**-0.5)}
    for e in range(MOE_EXPERTS):
        q = f"{prefix}experts.{e}."
        tensors[q + "gate_proj.weight"] = normal(f, hidden, std=hidden**-0.5)
        tensors[q + "up_proj.weight"] = normal(f, hidden, std=hidden**-0.5)
        tensors[q + "down_proj.weight"] = normal(hidden, f, std=3.0 * f**-0.5)
    return tensors


FAMILY = Family(
    arch="qwen3_moe",
    architecture="Qwen3MoeForCausalLM",
    model_type="qwen3_moe",  # a replica-only architecture: HF's model_type is its name
    presets=PRESETS,
    like_only=True,
    like_config=like_config,
    layer_tensors=qk_norms,
    mlp=experts,
)
