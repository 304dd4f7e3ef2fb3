"""LoRA adapters merged into the base weights, in the trainer's (tunix) layout.

Owns `split_update` (an update as base weights and LoRA factors) and `merge_lora`: for every
adapted parameter `W` with qwix LoRA factors `A` (`W_lora_a`, shape `(*contracted, rank)`) and
`B` (`W_lora_b`, shape `(rank, *kept)`), the merged weight is `W + scaling * tensordot(A, B,
1)`, with `scaling = alpha / rank` as qwix's `LoraProvider` applies it. qwix's einsum and
dot-general paths both compute `x @ A @ B * scaling` with the contracted dimensions of `W`
first, so the product has `W`'s shape; a factor pair whose product
does not (batched einsums, other layouts) is refused by name rather than merged wrongly.

Traceable: `WeightSwapper` runs it inside the same jitted program as tunix's mapping onto the
engine, so a LoRA sync is one program whose inputs are the frozen base and the adapters.
Must not import tunix or sgl_jax.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

LORA_A, LORA_B = "_lora_a", "_lora_b"


def lora_names(state: Any) -> list[str]:
    """Dotted paths of the LoRA factors in `state` (empty: no adapters)."""
    return [
        name
        for name in (".".join(map(str, path)) for path, _ in state.flat_state())
        if name.endswith((LORA_A, LORA_B))
    ]


def split_update(params: Any, actor: Any, scaling: float | None) -> tuple[Any, Any]:
    """`update_params`'s input as (base weights, LoRA factors or None).

    Without LoRA factors (or for weights in the engine's layout) the input is the base. With
    them, the base is the input's other parameters, or the frozen base of `actor` (the LoRA
    model the rollout was built with) when the input holds only the factors, which is what
    tunix's `sync_weights` sends. Raises ValueError when `scaling` or `actor` is missing."""
    from flax import nnx

    if not isinstance(params, nnx.State) or not lora_names(params):
        return params, None
    if scaling is None:
        raise ValueError(
            "update_params: LoRA factors need lora_scaling (qwix's alpha / rank): pass "
            "SglangJaxRollout(lora_scaling=...)"
        )
    lora = params.filter(nnx.LoRAParam)
    base = params.filter(nnx.Not(nnx.LoRAParam))
    if not jax.tree_util.tree_leaves(base):  # only adapters: the base is the actor's
        if actor is None:
            raise ValueError(
                "update_params: an adapters-only update needs the base weights: build the "
                "rollout with rollout_actor= (the LoRA model), as tunix's cluster does"
            )
        base = nnx.state(actor, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    return base, lora


def merge_lora(base: Any, lora: Any, scaling: float | jax.Array) -> Any:
    """A copy of `base` (an nnx State; its Variables are left alone) with every LoRA pair of
    `lora` merged into the parameter it adapts. Raises ValueError naming a factor without its
    pair, without a base parameter, or whose product does not have the parameter's shape."""
    base = jax.tree_util.tree_map(lambda x: x, base)  # fresh Variables, same arrays
    params = {tuple(path): variable for path, variable in base.flat_state()}
    factors: dict[tuple, dict[str, Any]] = {}
    for path, variable in lora.flat_state():
        name = str(path[-1])
        for suffix in (LORA_A, LORA_B):
            if name.endswith(suffix):
                target = (*path[:-1], name.removesuffix(suffix))
                factors.setdefault(target, {})[suffix] = variable.value
                break
        else:
            raise ValueError(
                f"update_params: {_dotted(path)} in the LoRA state is not a LoRA factor "
                f"(names end in {LORA_A} / {LORA_B})"
            )
    for target, pair in factors.items():
        if set(pair) != {LORA_A, LORA_B}:
            raise ValueError(f"update_params: LoRA factors of {_dotted(target)} come unpaired")
        if target not in params:
            raise ValueError(
                f"update_params: LoRA factors adapt {_dotted(target)}, which the base model lacks"
            )
        weight = params[target]
        a, b = pair[LORA_A], pair[LORA_B]
        delta_shape = (*a.shape[:-1], *b.shape[1:])
        if a.shape[-1] != b.shape[0] or delta_shape != tuple(weight.value.shape):
            raise ValueError(
                f"update_params: LoRA factors of {_dotted(target)} ({tuple(a.shape)} x "
                f"{tuple(b.shape)}) do not give the parameter's shape {tuple(weight.value.shape)}"
            )
        delta = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
        merged = weight.value.astype(jnp.float32) + scaling * delta
        weight.value = merged.astype(weight.value.dtype)
    return base


def _dotted(path: tuple) -> str:
    return ".".join(map(str, path))
