"""What the pre-flight does to weights and reads back from the engine's.

Owns `perturbed` (seeded noise on a state, for trained-looking weights and the sync check),
`small_adapters` (an early LoRA update: B factors below a bfloat16 step of W) and
`lora_update_error` (the update the engine serves against the trainer's, in float64). It
must not judge: `check_verdicts.py` sets the limits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np


def small_adapters(adapters: Any, seed: int, sigma: float = 1e-5) -> Any:
    """`adapters` with every B factor drawn from N(0, sigma): an early LoRA update."""
    import jax

    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            jax.numpy.asarray(rng.normal(0.0, sigma, x.shape), x.dtype)
            if "_lora_b" in jax.tree_util.keystr(path)
            else x
        ),
        adapters,
    )


def lora_update_error(rollout, trainer) -> float:
    """‖engine's s·A@B − trainer's s·A@B‖ / ‖trainer's‖ over every adapted module, in float64.

    The engine's update is read from its own weights (its static LoRA buffers, in its dtype),
    so whatever it serves is what is measured; the trainer's is qwix's `alpha / rank * A @ B`
    with each module's scaling from the rollout's LoRA layout."""
    import re

    from flax import nnx

    from sgl_jax_rollout.engine.gemma_mapping import engine_modules
    from sgl_jax_rollout.engine.lora import LORA_A, LORA_B, factor_pairs
    from sgl_jax_rollout.engine.moe_mapping import engine_module

    layout = rollout.engine.lora
    engine = {".".join(map(str, p)): v.value for p, v in rollout.engine.engine_state().flat_state()}
    num = den = 0.0
    for target, pair in factor_pairs(nnx.state(trainer, nnx.LoRAParam)).items():
        a, b = (np.asarray(pair[k], np.float64) for k in (LORA_A, LORA_B))
        rank = a.shape[-1]
        expected = layout.scaling(target) * a.reshape(-1, rank) @ b.reshape(rank, -1)
        layer, module = target.split(".")[1], target.split(".")[-2]
        served = []  # one tunix module may feed several engine modules (Gemma's kv_einsum)
        for fed in engine_modules(module):
            served_by = engine_module(rollout.engine.model_type, fed)  # Qwen3-MoE: c_proj
            prefix = next(
                name.removesuffix(".A_buffer")
                for name in engine
                if re.fullmatch(rf"model\.layers\.{layer}\.\w+\.{served_by}\.A_buffer", name)
            )
            a_buf, b_buf = (np.asarray(engine[f"{prefix}.{k}_buffer"][0], np.float64) for k in "AB")
            served.append((b_buf @ a_buf).T)
        served = np.concatenate(served, axis=1)
        num += float(((served - expected) ** 2).sum())
        den += float((expected**2).sum())
    return (num / den) ** 0.5


def perturbed(state: Any, scale: float, seed: int) -> Any:
    """`state` plus seeded normal noise of `scale` times each leaf's standard deviation (at
    least `scale` for constant leaves such as norms and zero-initialised LoRA factors).

    In one process, a compiled program per leaf shape (`_programs`), shared by every leaf of
    that shape, every seed and scale, and every model with that shape: one program over all
    the leaves took 9 s to compile on CPU for a 74-leaf Gemma 3 replica, and again for each
    seed. With one JAX process per host, one program over all the leaves (the same noise): a
    run of small programs on arrays that span processes (each reduction a collective) can
    interleave its collectives differently in each process on CPU, and hang."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(state)
    noisy_leaf, noisy_leaves = _programs()
    if jax.process_count() > 1:
        return jax.tree_util.tree_unflatten(treedef, noisy_leaves(leaves, scale, seed))
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    noisy = [noisy_leaf(x, key, scale) for x, key in zip(leaves, keys, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, noisy)


@functools.cache
def _programs() -> tuple[Callable, Callable]:
    """`perturbed`'s jitted programs: one leaf plus its noise, and every leaf (the keys split
    inside) plus theirs; `scale` and `seed` are arguments, not constants."""
    import jax

    def noisy_leaf(x, key, scale):
        sigma = x.std()
        sigma = jax.numpy.where(sigma > 0, sigma, 1.0)
        return x + (scale * sigma * jax.random.normal(key, x.shape)).astype(x.dtype)

    def noisy_leaves(leaves, scale, seed):
        keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
        return [noisy_leaf(x, key, scale) for x, key in zip(leaves, keys, strict=True)]

    return jax.jit(noisy_leaf), jax.jit(noisy_leaves)
