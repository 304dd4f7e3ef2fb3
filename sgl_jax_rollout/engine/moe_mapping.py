"""tunix's Qwen3-MoE parameters in sgl-jax's `Qwen3MoeForCausalLM` layout.

Owns `qwen3_moe_mapping` and `ENGINE_MODULE_NAMES`. tunix serves Qwen3-MoE with its qwen3
package (`models/qwen3/model.py` `MoELayer`), whose `mapping_sglang_jax` table (0.1.7 and main
at c7d8950f) has no entry for the experts or the router and names the attention output
`o_proj`, which sgl-jax's Qwen3-MoE attention calls `c_proj` (`srt/models/qwen3_moe.py:95` at
cddbf6f1). The mapping is tunix's own table with these entries changed:

| tunix | sgl-jax |
|---|---|
| `layers.i.mlp.router.kernel` `[D, E]` | `model.layers.i.moe_gate.kernel` `[D, E]` |
| `layers.i.mlp.gate_proj` `[E, D, F]` | `model.layers.i.mlp.wi_0` `[E, D, F]` |
| `layers.i.mlp.up_proj` `[E, D, F]` | `model.layers.i.mlp.wi_1` `[E, D, F]` |
| `layers.i.mlp.down_proj` `[E, F, D]` | `model.layers.i.mlp.wo` `[E, F, D]` |
| `layers.i.attn.o_proj.w` (and its LoRA factors) | `model.layers.i.self_attn.c_proj.*` |

Both sides stack the experts in the same layout (sgl-jax's loader transposes HF's `[out, in]`
per expert and stacks them, `layers/moe.py:808-814`; tunix's `_stack_experts`), so no
transpose. The dense-MLP entries go: a Qwen3-MoE layer has none.
"""

from __future__ import annotations

from typing import Any

# sgl-jax's name of a module, where it differs from tunix's, per config.json model_type.
ENGINE_MODULE_NAMES = {"qwen3_moe": {"o_proj": "c_proj"}}

_EXPERTS = {
    "layers.*.mlp.router.kernel": ("model.layers.*.moe_gate.kernel", (None, None)),
    "layers.*.mlp.gate_proj": ("model.layers.*.mlp.wi_0", ("expert", None, "tensor")),
    "layers.*.mlp.up_proj": ("model.layers.*.mlp.wi_1", ("expert", None, "tensor")),
    "layers.*.mlp.down_proj": ("model.layers.*.mlp.wo", ("expert", "tensor", None)),
}


def engine_module(model_type: str, module: str) -> str:
    """sgl-jax's name for the module tunix (and HF) call `module`, in a `model_type` engine."""
    return ENGINE_MODULE_NAMES.get(model_type, {}).get(module, module)


def qwen3_moe_mapping(qwen3: dict[str, Any]) -> dict[str, Any]:
    """tunix's qwen3 `SGLANG_JAX_MAPPING` (`qwen3`) made Qwen3-MoE's: the dense MLP's entries
    replaced by the router's and the stacked experts', and `o_proj` targets renamed `c_proj`."""

    def renamed(table: dict[str, Any]) -> dict[str, Any]:
        return {
            source: (target.replace(".o_proj.", ".c_proj."), sharding)
            for source, (target, sharding) in table.items()
            if not source.startswith("layers.*.mlp.")
        }

    mapping = dict(qwen3)
    mapping["to_hf_mappings"] = {**renamed(qwen3["to_hf_mappings"]), **_EXPERTS}
    mapping["lora_to_hf_mappings"] = renamed(qwen3["lora_to_hf_mappings"] or {})
    return mapping
