"""LoRA adapters served unmerged: the engine computes `x @ W + s * (x @ A) @ B`, as qwix does.

Owns `LoraLayout` (the shape of sgl-jax's static LoRA path for one actor: its largest rank,
the engine modules it adapts, each adapted parameter's scaling), `lora_layout` (read from the
actor's qwix adapters), `engine_lora_args` (sgl-jax's `ServerArgs` keywords for that path),
`split_update` (an update as base weights and LoRA factors) and `engine_factors` (the factors
as the engine's buffers take them: padded to the largest rank, each B times its module's
scaling, so the engine's one `lora_scaling` is 1).

Why unmerged: merging `W + s * A @ B` and rounding the result to a bfloat16 engine's weights
keeps `W` wherever the update is below half a bfloat16 step of `W`, which early LoRA updates
mostly are; the engine then serves another policy than the trainer's. Unmerged, the engine's
base weights are the trainer's frozen base bit for bit and the adapters' contribution is
computed on the activations, rounded as a bfloat16 trainer rounds it (docs/design.md, "LoRA").

Scaling per module: qwix stores no alpha on the factors; its `LoraProvider`'s rules live in
the closure of the actor's intercepted `__call__` (qwix `_src/model.py`, `quantize_model`'s
`new_fields`), where `provider_of` finds them; a rule applies to the modules whose
slash-joined path it fullmatches, first match first (qwix `_src/qconfig.py`,
`_get_current_rule_and_op_id`). Without rules, one `lora_scaling` serves every module, and
adapters of different ranks are refused by name (their alphas cannot be known).

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from typing import Any

import jax
import jax.numpy as jnp

from sgl_jax_rollout.engine.gemma_mapping import engine_modules
from sgl_jax_rollout.engine.moe_mapping import engine_module

LORA_A, LORA_B = "_lora_a", "_lora_b"


@dataclasses.dataclass(frozen=True)
class LoraLayout:
    """sgl-jax's static LoRA path for one actor. `modules` are the engine's adapted modules
    (`q_proj`; a tunix Gemma einsum feeds one or more, `gemma_mapping.ENGINE_MODULES`);
    `scalings` maps each adapted parameter's dotted tunix path (`layers.0.attn.q_proj.w`) to
    its alpha / rank."""

    rank: int
    modules: tuple[str, ...]
    scalings: tuple[tuple[str, float], ...]

    def scaling(self, target: str) -> float:
        return dict(self.scalings)[target]


def lora_names(state: Any) -> list[str]:
    """Dotted paths of the LoRA factors in `state` (empty: no adapters)."""
    return [
        name
        for name in (".".join(map(str, path)) for path, _ in state.flat_state())
        if name.endswith((LORA_A, LORA_B))
    ]


def lora_layout(actor: Any, lora_scaling: float | None) -> LoraLayout | None:
    """The static LoRA layout of `actor` (a qwix LoRA model), None without adapters.

    Raises ValueError naming the module when a scaling cannot be known: no qwix rules on the
    actor and no `lora_scaling`, ranks that differ without rules, or rules that do not explain
    a module's rank."""
    from flax import nnx

    if actor is None:
        return None
    factors = factor_pairs(nnx.state(actor, nnx.LoRAParam))
    if not factors:
        return None
    ranks = {target: pair[LORA_A].shape[-1] for target, pair in factors.items()}
    rules = provider_rules(actor)
    if rules is None:
        if lora_scaling is None:
            raise ValueError(
                "the LoRA actor carries no qwix LoraProvider rules to read alpha from: pass "
                "SglangJaxRollout(lora_scaling=alpha / rank)"
            )
        if len(set(ranks.values())) > 1:
            mix = ", ".join(f"{t} rank {r}" for t, r in sorted(ranks.items())[:4])
            raise ValueError(
                f"LoRA adapters of different ranks ({mix}, ...) and no qwix rules on the actor: "
                "one lora_scaling cannot be alpha / rank for all of them; build the actor with "
                "qwix.apply_lora_to_model so each module's alpha can be read"
            )
        scalings = {target: float(lora_scaling) for target in ranks}
    else:
        scalings = {target: _rule_scaling(rules, target, rank) for target, rank in ranks.items()}
        for target, scaling in sorted(scalings.items()):
            if lora_scaling is not None and abs(scaling - lora_scaling) > 1e-9 * scaling:
                raise ValueError(
                    f"lora_scaling={lora_scaling} contradicts the actor's qwix rules ({target}: "
                    f"alpha / rank = {scaling}); leave lora_scaling unset to take the rules'"
                )
    return LoraLayout(
        rank=max(ranks.values()),
        modules=tuple(
            sorted({m for target in ranks for m in engine_modules(target.split(".")[-2])})
        ),
        scalings=tuple(sorted(scalings.items())),
    )


def engine_lora_args(layout: LoraLayout, model_type: str) -> dict[str, Any]:
    """sgl-jax `ServerArgs` keywords of its static LoRA path (one adapter, always applied) for
    `layout` on a `model_type` engine (its own module names, `moe_mapping.engine_module`):
    scaling 1, since `engine_factors` folds each module's scaling into its B."""
    return {
        "enable_static_lora": True,
        "max_lora_rank": layout.rank,
        "lora_target_modules": [engine_module(model_type, m) for m in layout.modules],
        "lora_scaling": 1.0,
        "max_loras_per_batch": 1,
    }


def split_update(params: Any, actor: Any) -> tuple[Any, Any]:
    """`update_params`'s input as (base weights, LoRA factors or None).

    Without LoRA factors (or for weights in the engine's layout) the input is the base. With
    them, the base is the input's other parameters, or the frozen base of `actor` (the LoRA
    model the rollout was built with) when the input holds only the factors, which is what
    tunix's `sync_weights` sends. Raises ValueError when the rollout has no LoRA actor."""
    from flax import nnx

    if not isinstance(params, nnx.State) or not lora_names(params):
        return params, None
    if actor is None or not lora_names(nnx.state(actor, nnx.LoRAParam)):
        raise ValueError(
            "update_params: LoRA factors on a rollout built without a LoRA actor: build it "
            "with rollout_actor= (the qwix LoRA model), as tunix's cluster does, so the engine "
            "serves the adapters"
        )
    lora = params.filter(nnx.LoRAParam)
    base = params.filter(nnx.Not(nnx.LoRAParam))
    if not jax.tree_util.tree_leaves(base):  # only adapters: the base is the actor's
        base = nnx.state(actor, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    return base, lora


def engine_factors(lora: Any, layout: LoraLayout) -> Any:
    """A copy of `lora` (an nnx State of qwix factors) in the layout of sgl-jax's static LoRA
    buffers, in float32: A `(*contracted, r)` as `(1, rank, prod(contracted))`, B `(r, *kept)`
    as `(1, prod(kept), rank)` times its module's scaling, both padded with zeros to
    `layout.rank` (the same product). Traceable. Raises ValueError naming a factor without its
    pair, a module the layout lacks, or a pair whose ranks disagree.

    The layout is made here, not by tunix's `lora_to_hf_transpose_keys`: at tunix 0.1.7
    `generate/utils.py` `_apply_transpose` matches those wildcard keys in its generic branch,
    which transposes without the leading axis the LoRA branch adds (a 2-D factor raises), and
    the o_proj A permutation `(0, 3, 2, 1)` would put head_dim before heads."""
    lora = jax.tree_util.tree_map(lambda x: x, lora)  # fresh Variables, same arrays
    scalings = dict(layout.scalings)
    for target, pair in factor_pairs(lora, variables=True).items():
        if set(pair) != {LORA_A, LORA_B}:
            raise ValueError(f"update_params: LoRA factors of {target} come unpaired")
        a, b = pair[LORA_A], pair[LORA_B]
        rank = a.value.shape[-1]
        if b.value.shape[0] != rank or rank > layout.rank:
            raise ValueError(
                f"update_params: LoRA factors of {target} ({tuple(a.value.shape)} x "
                f"{tuple(b.value.shape)}) do not pair at a rank <= {layout.rank}"
            )
        if target not in scalings:
            raise ValueError(
                f"update_params: LoRA factors adapt {target}, which the rollout's LoRA actor "
                "does not adapt (the engine serves the actor's adapted modules only)"
            )
        pad = ((0, 0), (0, layout.rank - rank))
        a_flat = a.value.astype(jnp.float32).reshape(-1, rank)
        b_flat = b.value.astype(jnp.float32).reshape(rank, -1) * scalings[target]
        a.value = jnp.pad(a_flat, pad).T[None]
        b.value = jnp.pad(b_flat.T, pad)[None]
    return lora


def provider_rules(actor: Any) -> list | None:
    """The rules of the qwix `LoraProvider` the actor was adapted with, None when it carries
    none (a model built otherwise)."""
    import qwix

    provider = _find(type(actor).__dict__.get("__call__"), qwix.LoraProvider, depth=6)
    return None if provider is None else list(provider._rules)


def _find(obj: Any, kind: type, depth: int, seen: set | None = None) -> Any:
    """`obj`, or the first `kind` among the closures, partial arguments and wrapped functions
    reachable from it within `depth` steps."""
    seen = seen if seen is not None else set()
    if isinstance(obj, kind):
        return obj
    if depth == 0 or id(obj) in seen:
        return None
    seen.add(id(obj))
    inner: list[Any] = []
    if isinstance(obj, functools.partial):
        inner += [obj.func, *obj.args, *obj.keywords.values()]
    for cell in getattr(obj, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell has no contents
            inner.append(cell.cell_contents)
    if getattr(obj, "__wrapped__", None) is not None:
        inner.append(obj.__wrapped__)
    for item in inner:
        found = _find(item, kind, depth - 1, seen)
        if found is not None:
            return found
    return None


def _rule_scaling(rules: list, target: str, rank: int) -> float:
    module = "/".join(target.split(".")[:-1])
    for rule in rules:
        if re.fullmatch(rule.module_path, module):
            if rule.rank != rank:
                raise ValueError(
                    f"the actor's qwix rule {rule.module_path!r} (rank {rule.rank}) matches "
                    f"{target} first, whose adapters have rank {rank}: cannot tell its alpha"
                )
            return float(rule.alpha) / rule.rank
    raise ValueError(f"no qwix rule of the actor matches {target}, which carries adapters")


def factor_pairs(state: Any, variables: bool = False) -> dict[str, dict[str, Any]]:
    """{adapted parameter's dotted path: {LORA_A: factor, LORA_B: factor}} of `state` (the
    arrays, or with `variables` the Variables). Raises ValueError on a non-factor name."""
    pairs: dict[str, dict[str, Any]] = {}
    for path, variable in state.flat_state():
        name = str(path[-1])
        for suffix in (LORA_A, LORA_B):
            if name.endswith(suffix):
                target = ".".join(map(str, (*path[:-1], name.removesuffix(suffix))))
                pairs.setdefault(target, {})[suffix] = variable if variables else variable.value
                break
        else:
            raise ValueError(
                f"update_params: {'.'.join(map(str, path))} in the LoRA state is not a LoRA "
                f"factor (names end in {LORA_A} / {LORA_B})"
            )
    return pairs
