"""Weight updates of the running engine: map, reshard, check, swap.

Owns `WeightSwapper`: it takes either a tunix nnx state (qwen2, qwen3, llama3: mapped with
tunix's own `mapping_sglang_jax` tables and `transfer_state_with_mappings`; Gemma 2, 3 and
4, for which tunix has none, with `engine.gemma_mapping`; traced once into one jitted
program) or a pytree in the engine's own layout, puts every leaf on the sharding of the leaf it
replaces, checks path, shape and dtype of every leaf, and only then swaps. A mismatch raises
`ValueError` naming the parameter, and the engine keeps its old weights.

Integrity: every engine parameter is written by the update, or it raises naming what is
missing (an update of the base alone on an engine serving LoRA keeps the adapters' buffers).
tunix's mapper only logs "No mapping for source key" and leaves every target it did not write
at its old value; here a source parameter without a mapping, an engine parameter the
mapping did not write (found at trace time: its output is its own input) and a non-floating
leaf are errors. Floating leaves are cast to the engine's dtype (a float32 trainer into a
bfloat16 engine is the usual case). A LoRA update (`engine.lora`) writes the base to the adapted
layers' `base_layer` weights and the factors to sgl-jax's static LoRA buffers, with tunix's
`lora_to_hf_mappings` names (Gemma: `gemma_mapping.engine_lora_buffers`), in the same program.

The swap itself (upstream shape at the pinned commit) is: replace
`model_runner.model_state_leaves` with leaves of the same tree, shape, dtype and sharding
(what the jitted forward reads at every call; no recompilation), and update the runner's
nnx model with the same arrays so the old ones are freed. The caller serialises it with
generation (`engine.RolloutEngine`). Only device-to-device transfers happen here, so it
runs inside tunix's `transfer_guard("disallow_explicit")`. A trainer on other devices than
the engine's (`shared_devices: false` presets) has its leaves moved to the engine's devices
first, each split across them.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from sgl_jax_rollout.engine.gemma_mapping import engine_lora_buffers, engine_params
from sgl_jax_rollout.engine.hosts import HostLocal, split_over
from sgl_jax_rollout.engine.lora import LORA_A, LORA_B, LoraLayout, engine_factors
from sgl_jax_rollout.engine.moe_mapping import qwen3_moe_mapping

# config.json model_type -> tunix model package with a mapping_sglang_jax module.
TUNIX_FAMILIES = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "qwen2": "qwen2", "llama": "llama3"}
# config.json model_type of the families mapped by `engine.gemma_mapping`.
GEMMA_TYPES = ("gemma2", "gemma3", "gemma3_text", "gemma4")


class WeightSwapper:
    def __init__(self, model_runner: Any, model_type: str, lora: LoraLayout | None = None) -> None:
        self._runner = model_runner
        self._model_type = model_type
        self._lora = lora
        self._mapper = None
        self._host_local = HostLocal(
            list(model_runner.model_state_leaves[0].sharding.mesh.devices.flat)
        )
        state = nnx.state(model_runner.model)
        self._treedef = jax.tree_util.tree_structure(state)
        # The runner model's own Variables, in the order of `model_state_leaves`.
        self._variables = jax.tree_util.tree_leaves(
            state, is_leaf=lambda x: isinstance(x, nnx.Variable)
        )
        if len(self._variables) != len(model_runner.model_state_leaves):
            raise RuntimeError(
                "sgl-jax's model_state_leaves no longer match the model's parameters "
                f"({len(model_runner.model_state_leaves)} vs {len(self._variables)})"
            )

    def engine_state(self) -> nnx.State:
        """The engine's current parameters, in its own layout (fresh Variables, same arrays)."""
        return jax.tree_util.tree_unflatten(self._treedef, self._runner.model_state_leaves)

    def prepare(self, params: Any, lora: Any = None) -> list[jax.Array]:
        """New leaves for the engine, checked against the current ones (raises on mismatch).

        With `lora` (a tunix state of qwix LoRA factors), `params` is the frozen base in tunix's
        layout: the base goes to the adapted layers' `base_layer` weights and the factors to
        sgl-jax's static LoRA buffers (`engine.lora.engine_factors`), in one mapping program.
        """
        try:
            leaves, treedef = jax.tree_util.tree_flatten(params)
            lora_leaves, lora_def = jax.tree_util.tree_flatten(lora)
        except Exception as err:
            raise ValueError(f"update_params: cannot read the new parameters: {err}") from err
        _refuse_non_floating(params)
        _refuse_non_floating(lora)
        # A trainer on every device (spanning hosts, or the engine's devices and more): this
        # host's copy, on the engine's devices.
        leaves, lora_leaves = self._host_local(leaves), self._host_local(lora_leaves)
        if lora is not None:
            if self._lora is None:
                raise ValueError(
                    "update_params: LoRA factors for an engine started without LoRA buffers: "
                    "build the rollout with the LoRA actor (rollout_actor=)"
                )
            return self._checked(self._from_tunix(treedef, leaves, params, (lora_def, lora_leaves)))
        if treedef != self._treedef:
            leaves = self._from_tunix(treedef, leaves, params)
        return self._checked(leaves)

    def swap(self, leaves: list[jax.Array]) -> None:
        self._runner.model_state_leaves = list(leaves)
        for variable, leaf in zip(self._variables, leaves, strict=True):
            variable.set_value(leaf)

    def _from_tunix(
        self, src_def: Any, src_leaves: list, params: Any, lora: tuple | None = None
    ) -> list[jax.Array]:
        """tunix's state (with `lora`, the `(treedef, leaves)` of its factors too) in the
        engine's layout, by one program jitted at the first update: the family's `transfer`,
        fused, its outputs on the engine's shardings (one copy of the weights per update).
        Flat leaf lists keep the dispatch cheap; the static tree structures need no
        host-to-device transfer, which tunix's CPU transfer guard forbids."""
        if self._mapper is None:
            if self._model_type in GEMMA_TYPES:
                transfer = self._gemma_transfer()
            else:
                transfer = self._tunix_transfer(params)
            shardings = [x.sharding for x in self._runner.model_state_leaves]
            self._mapper = jax.jit(transfer, static_argnums=(0, 1), out_shardings=shardings)
        # tunix calls gc.collect() while tracing: a full collection over everything jax and
        # sgl-jax allocated (~270 ms). Frozen objects are skipped; unfreeze right after.
        gc.freeze()
        try:
            lora_def, lora_leaves = lora or (None, [])
            return self._mapper(
                src_def,
                lora_def,
                self._on_engine_devices(src_leaves),
                self._on_engine_devices(lora_leaves),
                self._runner.model_state_leaves,
            )
        except WeightSyncError:
            raise
        except Exception as err:  # tunix raises several types; name the stage for the user
            raise ValueError(f"update_params: mapping the tunix state failed: {err}") from err
        finally:
            gc.unfreeze()

    def _tunix_transfer(self, params: Any) -> Callable:
        """The mapping program's body for a family tunix ships `mapping_sglang_jax` for: its
        tables and `transfer_state_with_mappings`, every source key and engine target checked."""
        family = TUNIX_FAMILIES.get(self._model_type)
        if family is None:
            raise ValueError(
                f"update_params: the parameters are not in the engine's layout and there is no "
                f"tunix mapping for model_type {self._model_type!r} (supported tunix families: "
                f"{sorted(TUNIX_FAMILIES)}); first difference: "
                f"{_structure_difference(params, self.engine_state())}"
            )
        from sgl_jax_rollout import tunix_compat as tunix

        table = tunix.model_module(family, "mapping_sglang_jax").SGLANG_JAX_MAPPING
        if self._model_type == "qwen3_moe":  # tunix's table lacks the experts
            table = qwen3_moe_mapping(table)
        config = tunix.MappingConfig.build(mapping_obj=table)
        num_kv_heads = self._runner.model_config.get_total_num_kv_heads()
        head_dim = self._runner.model_config.head_dim
        served = _served_name([n for n, _ in _dotted(self.engine_state())])
        base_mappings = {
            source: (served(target), sharding)
            for source, (target, sharding) in config.to_hf_mappings.items()
        }
        if self._lora is not None and not config.lora_to_hf_mappings:
            raise ValueError(
                f"update_params: tunix ships no sgl-jax LoRA mapping for {family}; its "
                "adapters cannot reach the engine"
            )
        layout = self._lora
        treedef = self._treedef
        engine_names = _leaf_names(self.engine_state())

        def mapped(src_state, dst_state, mappings, transposes):
            # tunix's own source -> target table, as its transfer builds it.
            table_keys = tunix.build_flat_dict(dst_state.flat_state(), mappings)
            unmapped = [
                key for key, _ in _dotted(src_state) if "rng" not in key and key not in table_keys
            ]
            if unmapped:
                raise WeightSyncError(
                    f"update_params: {len(unmapped)} parameter(s) of the new state have no "
                    f"mapping onto the engine's {family} model: {_listed(unmapped)}"
                    + _lora_hint(unmapped)
                )
            # coverage is checked here and below, so tunix's "No mapping" warning is dropped
            return tunix.transfer_state_checked(
                src_state=src_state,
                dst_state=dst_state,
                key_mappings=mappings,
                key_mapping_hook_fns=config.to_hf_hook_fns,
                transpose_keys=transposes,
                rollout_engine="sglang_jax",
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
            )

        def transfer(src_def, lora_def, src_leaves: list, lora_leaves: list, dst_leaves: list):
            src_state = jax.tree_util.tree_unflatten(src_def, src_leaves)
            out = jax.tree_util.tree_unflatten(treedef, dst_leaves)
            out = mapped(src_state, out, base_mappings, config.to_hf_transpose_keys)
            if lora_def is not None:
                adapters = _adapters(lora_def, lora_leaves, layout)
                # Already in the buffers' layout (`engine_factors`): no transposes.
                out = mapped(adapters, out, config.lora_to_hf_mappings, {})
            out_leaves = jax.tree_util.tree_leaves(out)
            # A target tunix did not write comes back as its own input tracer.
            unwritten = [
                engine_names[i]
                for i, (new, old) in enumerate(zip(out_leaves, dst_leaves, strict=True))
                if new is old and _must_write(engine_names[i], lora_def is not None)
            ]
            if unwritten:
                raise WeightSyncError(
                    f"update_params: the new state does not cover {len(unwritten)} engine "
                    f"parameter(s), which would keep their old values: {_listed(unwritten)}"
                )
            return out_leaves

        return transfer

    def _gemma_transfer(self) -> Callable:
        """The mapping program's body for Gemma, through `engine.gemma_mapping` (tunix ships
        no sgl-jax mapping for it), with the same integrity checks: every tunix parameter
        known, every engine parameter written. With LoRA, the base goes to the adapted layers'
        `base_layer` weights and the factors to the static LoRA buffers (`engine_lora_buffers`)."""
        engine_names = _dotted_leaf_names(self.engine_state())
        served = _served_name(engine_names)
        layout = self._lora

        def transfer(src_def, lora_def, src_leaves: list, lora_leaves: list, dst_leaves: list):
            src = jax.tree_util.tree_unflatten(src_def, src_leaves)
            adapters = None if lora_def is None else _adapters(lora_def, lora_leaves, layout)
            try:
                params = engine_params(dict(zip(_dotted_leaf_names(src), src_leaves, strict=True)))
                mapped = {served(name): value for name, value in params.items()}
                if adapters is not None:
                    names = _dotted_leaf_names(adapters)
                    factors = dict(zip(names, jax.tree_util.tree_leaves(adapters), strict=True))
                    mapped.update(engine_lora_buffers(factors))
            except ValueError as err:  # a tunix parameter or factor it does not know
                raise WeightSyncError(str(err)) from err
            unknown = sorted(set(mapped) - set(engine_names))
            missing = [
                n for n in engine_names if n not in mapped and _must_write(n, lora_def is not None)
            ]
            if unknown or missing:
                raise WeightSyncError(
                    "update_params: tunix's Gemma state does not match the engine's Gemma "
                    f"parameters (not in the engine: {_listed(unknown)}; not written: "
                    f"{_listed(missing)})"
                )
            return [
                mapped.get(name, old).astype(old.dtype)  # kept: adapters of a base update
                for name, old in zip(engine_names, dst_leaves, strict=True)
            ]

        return transfer

    def _on_engine_devices(self, leaves: list) -> list:
        """Leaves on other devices than the engine's (a trainer on its own devices) are moved
        over first, each split across the engine's devices (`hosts.split_over`), never gathered
        whole on one device; one program cannot span two device sets."""
        mesh = self._runner.model_state_leaves[0].sharding.mesh
        engine_devices = set(mesh.devices.flat)
        return [
            leaf
            if not isinstance(leaf, jax.Array) or leaf.sharding.device_set == engine_devices
            else jax.device_put(leaf, split_over(mesh, leaf))
            for leaf in leaves
        ]

    def _checked(self, new: list) -> list[jax.Array]:
        """Each new leaf with the engine leaf's shape, dtype and sharding (raises naming it)."""
        leaves = []
        for index, (old_leaf, new_leaf) in enumerate(
            zip(self._runner.model_state_leaves, new, strict=True)
        ):
            if not hasattr(new_leaf, "shape") or tuple(new_leaf.shape) != tuple(old_leaf.shape):
                raise ValueError(
                    f"update_params: parameter {_leaf_names(self.engine_state())[index]} has "
                    f"shape {getattr(new_leaf, 'shape', type(new_leaf).__name__)}, the engine "
                    f"expects {tuple(old_leaf.shape)}"
                )
            if new_leaf.dtype != old_leaf.dtype:
                new_leaf = new_leaf.astype(old_leaf.dtype)
            if getattr(new_leaf, "sharding", None) != old_leaf.sharding:
                new_leaf = jax.device_put(new_leaf, old_leaf.sharding)
            leaves.append(new_leaf)
        return leaves


class WeightSyncError(ValueError):
    """An update that would leave the engine with parameters the trainer did not send."""


def _refuse_non_floating(params: Any) -> None:
    """Only floating leaves are weights (tunix would cast an integer leaf silently); RNG state,
    which tunix skips by name, is left out."""
    bad = [
        f"{jax.tree_util.keystr(path)} ({leaf.dtype})"
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if hasattr(leaf, "dtype")
        and "rng" not in jax.tree_util.keystr(path)
        and not jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating)
    ]
    if bad:
        raise WeightSyncError(
            f"update_params: parameters must have a floating dtype; not {_listed(bad)}"
        )


def _listed(names: list[str], limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _lora_hint(keys: list[str]) -> str:
    if any(key.endswith((LORA_A, LORA_B)) for key in keys):
        return (
            ". These are LoRA factors: pass them as update_params(lora_state, (nnx.LoRAParam,)) "
            "on a rollout built with the LoRA actor (rollout_actor=)"
        )
    return ""


def _served_name(engine_names: list[str]) -> Callable[[str], str]:
    """Renames a parameter name (`...q_proj.weight`; `*` for any index, as in tunix's tables)
    to its `...q_proj.base_layer.weight` where sgl-jax's static LoRA wrapped the layer
    (`srt/lora/layers.py` `BaseLayerWithLoRA`): where the engine serves the wrapped name and
    not the name itself."""
    names, joined = set(engine_names), "\n".join(engine_names)

    def serves(name: str) -> bool:
        if "*" not in name:
            return name in names
        pattern = re.escape(name).replace(r"\*", r"\d+")
        return re.search(f"^{pattern}$", joined, re.M) is not None

    def rename(name: str) -> str:
        head, _, last = name.rpartition(".")
        wrapped = f"{head}.base_layer.{last}"
        return wrapped if serves(wrapped) and not serves(name) else name

    return rename


def _adapters(lora_def: Any, lora_leaves: list, layout: LoraLayout) -> Any:
    """The LoRA factors in the layout of sgl-jax's static LoRA buffers (`engine_factors`)."""
    try:
        return engine_factors(jax.tree_util.tree_unflatten(lora_def, lora_leaves), layout)
    except ValueError as err:
        raise WeightSyncError(str(err)) from None


def _must_write(name: str, with_lora: bool) -> bool:
    """Whether an update must write engine parameter `name`: every one, except sgl-jax's static
    LoRA buffers in an update without adapters (the base alone, on an engine serving LoRA),
    which keeps them as they are."""
    return with_lora or ("A_buffer" not in name and "B_buffer" not in name)


def _dotted(state: Any) -> list[tuple[str, Any]]:
    return [(".".join(map(str, path)), v) for path, v in state.flat_state()]


def _dotted_leaf_names(tree: Any) -> list[str]:
    """Each leaf's path as dotted names (`model.layers.0.mlp.up_proj.weight`), in leaf order."""
    names = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = [getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path]
        names.append(".".join(str(part) for part in parts if part != "value"))
    return names


def _leaf_names(tree: Any) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _structure_difference(candidate: Any, current: nnx.State) -> str:
    """The first parameter where the new tree differs from the engine's (error path only)."""
    old, new = _leaf_names(current), _leaf_names(candidate)
    for engine_name, new_name in zip(old, new, strict=False):
        if engine_name != new_name:
            return f"parameter {new_name} found where the engine has {engine_name}"
    return f"{len(new)} parameters where the engine has {len(old)}"
