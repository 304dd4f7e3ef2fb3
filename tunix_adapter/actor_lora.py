"""LoRA adapters on the trainer's actor: qwix's, as tunix's own CLI applies them.

Owns `LORA_MODULES` (the module names adapted by default, Gemma's einsums included),
`lora_scaling` (alpha / rank, the scaling the rollout engine serves the adapters with) and
`with_lora`. It must not touch the rollout: the engine side serves the adapters on its own
LoRA path (`sgl_jax_rollout.engine.lora`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from sgl_jax_rollout.tunix_compat import reshard_model_to_mesh

LORA_MODULES = (
    ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"
    # Gemma's attention einsums (tunix's Gemma GRPO examples adapt these names)
    "|.*q_einsum|.*kv_einsum|.*k_einsum|.*qkv_einsum|.*attn_vec_einsum"
)


def lora_scaling(lora: Mapping[str, Any] | None) -> float | None:
    """qwix's LoRA scaling, alpha / rank (None without LoRA)."""
    if not lora:
        return None
    rank, alpha = lora.get("rank"), lora.get("alpha")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora rank must be an integer >= 1, got {rank!r}")
    if not isinstance(alpha, int | float) or alpha <= 0:
        raise ValueError(f"lora alpha must be > 0, got {alpha!r}")
    return float(alpha) / rank


def with_lora(model: Any, lora: Mapping[str, Any], mesh: jax.sharding.Mesh) -> Any:
    """`model` with qwix LoRA adapters (B = 0: the same function until trained), as tunix's
    own CLI applies them."""
    import qwix

    lora_scaling(lora)
    provider = qwix.LoraProvider(
        module_path=lora.get("module_path", LORA_MODULES), rank=lora["rank"], alpha=lora["alpha"]
    )
    adapted = qwix.apply_lora_to_model(
        model, provider, rngs=nnx.Rngs(lora.get("seed", 0)), **model.get_model_input()
    )
    return reshard_model_to_mesh(adapted, mesh)
