"""tunix's Gemma 2, 3 and 4 parameters in sgl-jax's Gemma 2 / our Gemma 3 / Gemma 4 layouts.

Owns `engine_params`: tunix ships no sgl-jax mapping for its Gemmas (0.1.7 and main at
c7d8950f: `tunix/models/gemma/`, `gemma3/` and `gemma4/` have no `mapping_sglang_jax`), so
the update of a Gemma engine maps here, name by name, every parameter of tunix's `Gemma` /
`Gemma3` / `Gemma4` onto sgl-jax's `Gemma2ForCausalLM` (`srt/models/gemma2.py` at cddbf6f1,
`_create_weight_mappings`), our `Gemma3ForCausalLM` (`engine/models/gemma3.py`, the same plus
the q / k norms) or `Gemma4ForConditionalGeneration` (`srt/models/gemma4.py`,
`_create_gemma4_weight_mappings`): the HF names, linear weights stored `[in, out]`. The
families' tunix names do not collide (Gemma 3's are Gemma 2's with Gemma 4's norm names), so
one table serves all three:

| tunix | sgl-jax |
|---|---|
| `embedder.input_embedding` `[V, D]` | `model.embed_tokens.embedding` (tied: also the output) |
| `final_norm.scale` | `model.norm.weight` |
| `layers.i.<tunix norm>.scale` | `model.layers.i.<HF norm>.weight` (`_NORMS`) |
| `layers.i.attn.q_einsum.w` `[N, D, H]` | `...self_attn.q_proj.weight` `[D, N * H]` |
| `layers.i.attn.kv_einsum.w` `[2, K, D, H]` | `...self_attn.{k,v}_proj.weight` `[D, K * H]` |
| `layers.i.attn.qkv_einsum.w` `[3, N, D, H]` (N == K) | `...self_attn.{q,k,v}_proj.weight` |
| `layers.i.attn.attn_vec_einsum.w` `[N, H, D]` | `...self_attn.o_proj.weight` `[N * H, D]` |
| `layers.i.mlp.{gate,up,down}_proj.kernel` | `...mlp.{gate,up,down}_proj.weight` (same layout) |
| Gemma 4: `layers.i.attn.k_einsum.w` `[K, D, H]` (keys = values) | `...self_attn.k_proj.weight` |
| Gemma 3 / 4: `layers.i.attn._{query,key}_norm.scale` | `...self_attn.{q,k}_norm.weight` |
| Gemma 4: `layers.i.skip_scale` | `model.layers.i.layer_scalar` |

Both sides keep the norm weights alike (Gemma 2 / 3: `w` of `x * (1 + w)`; Gemma 4: `x * w`). Pure
jax.numpy reshapes:
traced into the engine's update program.

LoRA (`engine_lora_buffers`): qwix adapts an einsum by its weight's contracted axes (A) and
kept axes (B) (qwix `_src/providers/lora.py` `_parse_einsum_str_for_lora`), so one tunix
einsum can feed several sgl-jax modules (`ENGINE_MODULES`): `kv_einsum`'s A `[D, r]` is the A
of both `k_proj` and `v_proj` and its B `[r, 2, K, H]` splits in two; `qkv_einsum` likewise in
three. The factors arrive in the engine buffers' layout already (`engine.lora.engine_factors`:
A `(1, R, in)`, B `(1, out, R)`), so a split is along B's output axis.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
from jaxtyping import Array

_NORMS = {
    "pre_attention_norm": "input_layernorm",
    "post_attn_norm": "post_attention_layernorm",  # Gemma 2
    "post_attention_norm": "post_attention_layernorm",  # Gemma 3 / 4
    "pre_ffw_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn._query_norm": "self_attn.q_norm",
    "attn._key_norm": "self_attn.k_norm",
}
_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
# tunix Gemma module -> the sgl-jax Gemma 2 modules its adapters feed, in B's output order.
ENGINE_MODULES = {
    "q_einsum": ("q_proj",),
    "kv_einsum": ("k_proj", "v_proj"),
    "k_einsum": ("k_proj",),
    "qkv_einsum": ("q_proj", "k_proj", "v_proj"),
    "attn_vec_einsum": ("o_proj",),
}
_FACTOR = re.compile(r"layers\.(\d+)\.(attn|mlp)\.(\w+)\.(?:w|kernel)_lora_([ab])")


def _by_heads(w: Array) -> Array:
    """`[heads, D, H]` -> `[D, heads * H]`."""
    heads, dim, head_dim = w.shape
    return jnp.transpose(w, (1, 0, 2)).reshape(dim, heads * head_dim)


def engine_params(tunix_params: dict[str, Array]) -> dict[str, Array]:
    """sgl-jax's Gemma 2 or Gemma 4 parameters (dotted names) from tunix's (dotted names).
    Raises ValueError naming a tunix parameter it does not know."""
    out: dict[str, Array] = {}
    for name, value in tunix_params.items():
        if name == "embedder.input_embedding":
            out["model.embed_tokens.embedding"] = value
            continue
        if name == "final_norm.scale":
            out["model.norm.weight"] = value
            continue
        match = _LAYER.fullmatch(name)
        if match is None:
            raise ValueError(f"update_params: no sgl-jax Gemma parameter for tunix's {name!r}")
        layer, rest = match.groups()
        p = f"model.layers.{layer}."
        norm = rest.removesuffix(".scale")
        if norm in _NORMS:
            out[p + _NORMS[norm] + ".weight"] = value
        elif rest == "attn.q_einsum.w":
            out[p + "self_attn.q_proj.weight"] = _by_heads(value)
        elif rest == "skip_scale":
            out[p + "layer_scalar"] = value
        elif rest == "attn.k_einsum.w":
            out[p + "self_attn.k_proj.weight"] = _by_heads(value)
        elif rest == "attn.kv_einsum.w":
            out[p + "self_attn.k_proj.weight"] = _by_heads(value[0])
            out[p + "self_attn.v_proj.weight"] = _by_heads(value[1])
        elif rest == "attn.qkv_einsum.w":
            for i, proj in enumerate(("q", "k", "v")):
                out[p + f"self_attn.{proj}_proj.weight"] = _by_heads(value[i])
        elif rest == "attn.attn_vec_einsum.w":
            heads, head_dim, dim = value.shape
            out[p + "self_attn.o_proj.weight"] = value.reshape(heads * head_dim, dim)
        elif rest in ("mlp.gate_proj.kernel", "mlp.up_proj.kernel", "mlp.down_proj.kernel"):
            out[p + rest.replace(".kernel", ".weight")] = value
        else:
            raise ValueError(f"update_params: no sgl-jax Gemma parameter for tunix's {name!r}")
    return out


def engine_modules(module: str) -> tuple[str, ...]:
    """The sgl-jax modules that serve the adapters of tunix module `module` (a tunix Gemma
    einsum, or a module of the same name on both sides)."""
    return ENGINE_MODULES.get(module, (module,))


def engine_lora_buffers(factors: dict[str, Array]) -> dict[str, Array]:
    """sgl-jax's static LoRA buffers (`model.layers.i.self_attn.q_proj.A_buffer`, ...) from
    tunix Gemma LoRA factors (dotted names, `...q_einsum.w_lora_a`) already in the buffers'
    layout (`engine.lora.engine_factors`). Raises ValueError naming a factor it does not know."""
    out: dict[str, Array] = {}
    for name, value in factors.items():
        match = _FACTOR.fullmatch(name)
        if match is None:
            raise ValueError(f"update_params: no sgl-jax Gemma LoRA buffer for tunix's {name!r}")
        layer, block, module, factor = match.groups()
        block = "self_attn" if block == "attn" else block
        targets = engine_modules(module)
        parts = jnp.split(value, len(targets), axis=1) if factor == "b" else [value] * len(targets)
        for target, part in zip(targets, parts, strict=True):
            out[f"model.layers.{layer}.{block}.{target}.{factor.upper()}_buffer"] = part
    return out
