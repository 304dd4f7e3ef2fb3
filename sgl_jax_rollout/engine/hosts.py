"""Several JAX processes (one per host): what this process's engine serves, and how weights
on every device (a trainer spanning the engine's devices and more) reach it.

With one process per host (docs/design.md section 10) every host runs its own engine on its own
devices and samples its own share of the global batch; tunix assembles the trainer's global
arrays from every process's share (`make_array_from_process_local_data`, in process order on
our presets' meshes). Owns:

- `process_share()`: (this process's index, process count): the share `rollout_inputs.
  sample_seeds` gives seeds for, so every row of the global batch has its own stream and the
  seeds are those of one process sampling the whole batch.
- `split_over(mesh, leaf)`: a sharding of one weight over all of an engine mesh's devices,
  never whole on one device.
- `HostLocal`: trainer arrays on every device (spanning processes, or one process's devices
  beyond the engine's), as arrays on this host's engine devices. One jitted identity over a
  (hosts, copies, engine) mesh of every device puts each leaf replicated over hosts and split
  over each host's engine devices as `split_over` says; each process then wraps the shards on
  its engine devices as arrays of its own. Nothing is gathered whole on one device, and nothing
  passes through host memory (a `device_put` onto fewer devices does: tunix's transfer guard
  refuses it); the collectives are in that one compiled program (`HostLocal.program`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

HOST_AXIS = "hosts"
ENGINE_AXIS = "engine"
COPY_AXIS = "copies"


def process_share() -> tuple[int, int]:
    """(jax.process_index(), jax.process_count())."""
    return jax.process_index(), jax.process_count()


def split_over(mesh: Mesh, leaf: Any) -> NamedSharding:
    """A sharding of `leaf` over all of `mesh`'s devices: each mesh axis (largest first) splits
    the first free dimension it divides, preferring dimensions the leaf is already split
    along. Axes that divide no dimension replicate (small leaves: norms, biases)."""
    sharding = getattr(leaf, "sharding", None)
    src = sharding.spec if isinstance(sharding, NamedSharding) else ()
    split = [i for i, axis in enumerate(src) if axis is not None]
    order = split + [i for i in range(leaf.ndim) if i not in split]
    spec: list[Any] = [None] * leaf.ndim
    for axis, size in sorted(mesh.shape.items(), key=lambda item: -item[1]):
        if size == 1:
            continue
        for dim in order:
            if spec[dim] is None and leaf.shape[dim] % size == 0:
                spec[dim] = axis
                break
    return NamedSharding(mesh, PartitionSpec(*spec))


class HostLocal:
    """Arrays on every device -> arrays on this process's engine devices, split over them.

    `engine_devices`: this process's engine devices, its first ones (the same positions of
    `jax.local_devices()` in every process, checked across processes at the first use), their
    count dividing the local device count.
    """

    def __init__(self, engine_devices: list[Any]) -> None:
        self._engine_devices = list(engine_devices)
        self._meshes: tuple[Mesh, Mesh] | None = None
        self._programs: dict[tuple, tuple[Any, list[NamedSharding]]] = {}

    def __call__(self, leaves: list) -> list:
        """`leaves` with each one on every device replaced by a copy on this process's engine
        devices (split as `split_over` says); the others as they are. Every process must call
        it at the same time with the same tree (it runs one collective program)."""
        every, engine = set(jax.devices()), set(self._engine_devices)
        moving = [
            i
            for i, leaf in enumerate(leaves)
            if isinstance(leaf, jax.Array) and leaf.sharding.device_set == every != engine
        ]
        if not moving:
            return list(leaves)
        program, shardings = self.program([leaves[i] for i in moving])
        moved = program(*(leaves[i] for i in moving))
        out = list(leaves)
        for i, global_leaf, local in zip(moving, moved, shardings, strict=True):
            shards = [s.data for s in global_leaf.addressable_shards if s.device in engine]
            out[i] = jax.make_array_from_single_device_arrays(global_leaf.shape, local, shards)
        return out

    def program(self, leaves: list) -> tuple[Any, list[NamedSharding]]:
        """(the jitted identity that puts every leaf replicated over hosts and split over each
        host's engine devices, the shardings of the results on this process's engine devices).
        `program.lower(*leaves).compile()` is the program whose collectives one sync moves.

        One program cannot span two device sets, so its outputs live on every device the
        trainer's do: a host's other devices hold copies of its engine devices' pieces, which
        are dropped at once."""
        key = tuple((leaf.shape, leaf.dtype, leaf.sharding) for leaf in leaves)
        if key not in self._programs:
            global_mesh, engine_mesh = self.meshes()
            local = [split_over(engine_mesh, leaf) for leaf in leaves]
            out = tuple(NamedSharding(global_mesh, s.spec) for s in local)
            if len(self._programs) >= 4:  # a full update and a LoRA one alternate
                self._programs.clear()
            self._programs[key] = (jax.jit(_identity, out_shardings=out), local)
        return self._programs[key]

    def meshes(self) -> tuple[Mesh, Mesh]:
        """(mesh (hosts, copies, engine) over every process's devices, mesh (engine,) over this
        process's engine devices). Device order is the processes' in turn, each its engine
        devices first: the order of a trainer mesh over `jax.devices()` when the engine takes
        each host's first devices (a program's outputs must keep its inputs' device order)."""
        if self._meshes is None:
            from jax.experimental import multihost_utils

            local = list(jax.local_devices())
            engine = [local.index(d) for d in self._engine_devices]
            others = [i for i in range(len(local)) if i not in engine]
            if len(local) % len(engine):
                raise ValueError(
                    f"the engine's {len(engine)} devices must divide this process's "
                    f"{len(local)} devices to take weights that span processes"
                )
            multihost_utils.assert_equal(
                np.asarray(engine),
                "every process must place its engine on the same positions of its "
                "jax.local_devices()",
            )
            copies = len(local) // len(engine)
            grid = np.stack(
                [
                    np.asarray(jax.local_devices(process_index=p))[engine + others].reshape(
                        copies, len(engine)
                    )
                    for p in range(jax.process_count())
                ]
            )
            auto = jax.sharding.AxisType.Auto
            self._meshes = (
                Mesh(grid, (HOST_AXIS, COPY_AXIS, ENGINE_AXIS), axis_types=(auto,) * 3),
                Mesh(np.asarray(self._engine_devices), (ENGINE_AXIS,), axis_types=(auto,)),
            )
        return self._meshes


def _identity(*leaves: Any) -> tuple:
    return leaves
