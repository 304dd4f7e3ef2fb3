"""The engine's device memory given back while the trainer runs, and taken again.

Owns `Released` (what a release freed: each KV buffer's shape, dtype and sharding, and the
weights' when they went too) and the two halves, run on the scheduler thread while it is
fully idle (`engine.RolloutEngine.release_memory` / `resume_memory`):

- `release`: deletes every KV buffer of the runner's memory pools (sgl-jax's fused
  per-layer buffers, `MHATokenToKVPool.kv_buffer`, and a hybrid pool's two sub-pools) and,
  with `weights`, every parameter of the engine's model (`model_state_leaves`). The lists
  keep their (deleted) arrays, so the pools and the model keep their structure.
- `resume`: puts new zero KV buffers of the same shapes, dtypes and shardings in their place,
  in the same lists, so the engine's compiled programs take them as before (no recompile);
  `zero_weights`: released weights' stand-ins, which the caller swaps in (and replaces by real
  ones before any step).

Why here and not sgl-jax's `release_memory_occupation`: at the pinned commit (cddbf6f1) the
tokenizer manager sends `ReleaseMemoryOccupationReqInput` but the scheduler's dispatcher
(`managers/scheduler.py`, `TypeBasedDispatcher`) has no handler for it, so the call waits
forever. The prefix cache is flushed first (its KV is gone), by the caller.

`live_bytes` and `live_bytes_at_resume` measure it (on CPU, where no allocator statistics
exist). No sgl_jax import: reads the runner's attributes (`memory_pools`, `model_state_leaves`; each
listed in `upstream.ATTRIBUTES`, checked at engine start).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: Any
    sharding: Any

    @classmethod
    def of(cls, array: jax.Array) -> Spec:
        return cls(tuple(array.shape), array.dtype, array.sharding)

    def zeros(self) -> jax.Array:
        return _zeros_program(self)()

    @property
    def nbytes(self) -> int:
        size = 1
        for dim in self.shape:
            size *= dim
        return size * jnp.dtype(self.dtype).itemsize


@dataclasses.dataclass
class Released:
    """What `release` freed: each KV list with its buffers' specs, the weights' specs (None
    when they stayed), and the bytes."""

    kv: list[tuple[list, list[Spec]]]
    weights: list[Spec] | None

    @property
    def kv_bytes(self) -> int:
        return sum(spec.nbytes for _, specs in self.kv for spec in specs)

    @property
    def weight_bytes(self) -> int:
        return sum(spec.nbytes for spec in self.weights or ())


def kv_lists(runner: Any) -> list[list]:
    """The runner's per-layer KV buffer lists (one per plain pool, two per hybrid pool).
    Raises ValueError naming a pool whose buffers are laid out otherwise."""
    lists = []
    for name, pool in sorted(runner.memory_pools._pools.items()):
        subpools = [getattr(pool, n) for n in ("swa_kv_pool", "full_kv_pool") if hasattr(pool, n)]
        for sub in subpools or [pool]:
            buffers = getattr(sub, "kv_buffer", None)
            if not isinstance(buffers, list) or not all(isinstance(b, jax.Array) for b in buffers):
                raise ValueError(
                    f"release_memory: the engine's memory pool {name!r} "
                    f"({type(sub).__name__}) keeps no list of KV buffers; releasing it is not "
                    "supported"
                )
            lists.append(buffers)
    return lists


def release(runner: Any, weights: bool) -> Released:
    """Deletes the KV buffers (and with `weights` the model's parameters) in place; the
    programs that make their zero replacements are compiled first (once per shape), so a
    resume compiles nothing."""
    kv = [(buffers, [Spec.of(b) for b in buffers]) for buffers in kv_lists(runner)]
    weight_specs = [Spec.of(x) for x in runner.model_state_leaves] if weights else None
    for spec in {s for _, specs in kv for s in specs} | set(weight_specs or ()):
        _zeros_program(spec)
    for buffers, _ in kv:
        for buffer in buffers:
            buffer.delete()
    if weights:
        for leaf in runner.model_state_leaves:
            leaf.delete()
    return Released(kv, weight_specs)


def resume(released: Released) -> None:
    """New zero KV buffers in the released ones' places."""
    for buffers, specs in released.kv:
        buffers[:] = [spec.zeros() for spec in specs]


def zero_weights(released: Released) -> list[jax.Array]:
    """Zero weights of the released weights' specs (a release with weights only)."""
    assert released.weights is not None
    return [spec.zeros() for spec in released.weights]


@functools.cache
def _zeros_program(spec: Spec):
    """A compiled program making zeros of `spec` on its sharding (on the devices, never a
    host buffer of the pool's size)."""
    make = jax.jit(lambda: jnp.zeros(spec.shape, spec.dtype), out_shardings=spec.sharding)
    return make.lower().compile()


def live_bytes() -> int:
    """Bytes of every live device array of this process (what `bench memory` and the tests
    read on CPU, where no allocator statistics exist)."""
    return sum(x.nbytes for x in jax.live_arrays() if not x.is_deleted())


@contextlib.contextmanager
def live_bytes_at_resume(engine: Any):
    """Within it, the live bytes at the two largest moments of a resume through the engine's
    `update_weights` (`engine.RolloutEngine`): its new weights mapped, its KV pool back;
    yields the list they are appended to (`bench memory` and the tests read the peak)."""
    global resume  # the engine calls `memory.resume`
    peaks: list[int] = []
    weights = engine._weights  # the engine's weight mapper (engine/weights.py)
    prepare, resume_kv = weights.prepare, resume

    def after(fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            peaks.append(live_bytes())
            return out

        return call

    weights.prepare, resume = after(prepare), after(resume_kv)
    try:
        yield peaks
    finally:
        del weights.prepare
        resume = resume_kv
