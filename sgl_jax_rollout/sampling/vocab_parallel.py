"""The sampler on logits split over the vocabulary (tensor parallelism), without gathering them.

Owns `sample_vocab_parallel`: `sampler.sample_step` under `shard_map`, each device on its own
columns of its rows (`P(batch_axis, vocab_axis)`, as a tensor-parallel LM head leaves them),
reading the vocabulary through `Vocab(size, vocab_axis)`. Collectives move per-row values and
candidates only (`[batch]`, `[batch, shards * C]`): never the `[batch, vocab]` logits that an
all-gather to `P(batch_axis, None)` moves. The results equal `sample`'s on the whole logits:
same tokens for seeded rows, the same logprobs, entropy and top logprobs up to float32 sums
taken in another order. docs/design.md, "A vocabulary-parallel sampler", has the
decomposition.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from sgl_jax_rollout.sampling.batch import SamplerConfig, SamplerOutput, SamplingBatch
from sgl_jax_rollout.sampling.sampler import DEFAULT_CONFIG, sample_step
from sgl_jax_rollout.sampling.vocab import Vocab

# Batch fields laid out like the logits (one column per vocabulary id); the others are per
# row and every shard of a row holds them whole.
_VOCAB_COLUMNS = ("seen", "output_counts")


@functools.partial(jax.jit, static_argnames=("config", "mesh", "vocab_axis", "batch_axis"))
def sample_vocab_parallel(
    logits: Float[Array, "batch vocab"],
    batch: SamplingBatch,
    config: SamplerConfig = DEFAULT_CONFIG,
    *,
    mesh: Mesh | None = None,
    vocab_axis: str = "tensor",
    batch_axis: str | None = None,
) -> SamplerOutput:
    """One decode step with `logits` split over the mesh's `vocab_axis` (and the rows over
    `batch_axis`, if given); outputs are split over `batch_axis` only. `mesh` None: the
    context mesh (`jax.set_mesh`, or the engine's, inside its `auto_axes` step)."""
    devices = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if devices.empty:
        raise ValueError("sample_vocab_parallel needs a mesh: pass mesh= or use jax.set_mesh")
    vocab_size = logits.shape[1]
    shards = devices.shape[vocab_axis]
    if vocab_size % shards:
        raise ValueError(
            f"the vocabulary ({vocab_size}) must divide evenly over the {shards} devices of "
            f"mesh axis {vocab_axis!r}"
        )
    step = functools.partial(sample_step, config=config, vocab=Vocab(vocab_size, vocab_axis))
    in_specs = (P(batch_axis, vocab_axis), batch_specs(batch, batch_axis, vocab_axis))
    if all(t == AxisType.Explicit for t in devices.axis_types):
        # Explicit axes: shard_map takes inputs only as its specs say (a no-op for logits
        # that come out of a tensor-parallel LM head, a local slice for replicated rows).
        # Under Auto axes (the engine's step) the partitioner lays them out.
        logits, batch = jax.tree.map(
            lambda x, spec: jax.sharding.reshard(
                x, spec if mesh is None else NamedSharding(mesh, spec)
            ),
            (logits, batch),
            in_specs,
            is_leaf=lambda x: isinstance(x, P),
        )
    # check_vma off: the stages' `lax.cond` branches return constants on one side and
    # per-row values on the other; the outputs equal on every vocabulary shard is what the
    # equality tests against `sample` check.
    run = jax.shard_map(
        step,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=output_specs(config, batch_axis),
        check_vma=False,
    )
    return run(logits, batch)


def batch_specs(batch: SamplingBatch, batch_axis: str | None, vocab_axis: str) -> SamplingBatch:
    """Partition specs of `batch`'s fields inside the vocabulary-parallel step."""
    specs = {
        field.name: None
        if getattr(batch, field.name) is None
        else P(batch_axis, vocab_axis)
        if field.name in _VOCAB_COLUMNS
        else P(batch_axis)
        for field in dataclasses.fields(batch)
    }
    return SamplingBatch(**specs)


def output_specs(config: SamplerConfig, batch_axis: str | None) -> SamplerOutput:
    """Partition specs of the step's outputs (None for outputs the config does not ask for)."""
    rows = P(batch_axis)
    return SamplerOutput(
        tokens=rows,
        logprobs=rows if config.return_logprob else None,
        entropy=rows if config.return_entropy else None,
        top_logprob_ids=rows if config.top_logprobs else None,
        top_logprobs=rows if config.top_logprobs else None,
    )
