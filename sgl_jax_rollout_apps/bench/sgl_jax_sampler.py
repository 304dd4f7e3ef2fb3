"""sgl-jax's own `Sampler`, called the way its model runner calls it, for the sampler bench.

Owns only the construction of sgl-jax's inputs (a one-device mesh, `LogitsProcessorOutput`,
`SamplingMetadata` with logprobs on) and a jitted call mirroring `ModelRunner.jitted_sampler`
at the pinned commit. Imports sgl_jax: `sampler_bench` loads it only when that works.
The linear penalty is a zero array with `do_penalties=True`, so sgl-jax's penalty step runs
(sgl-jax builds that array outside the sampler, which is not timed here).
`use_sort_for_toppk_minp=True`: sgl-jax's default mask path (binary-search top-k / top-p)
raises `ShardingTypeError` ("select cases must have the same shardings") in
`binary_search.int32_bsearch` at the pinned commit on CPU with this explicit mesh, so the
sort path, which sgl-jax takes on CPU through a numpy callback, is the one measured.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sgl_jax_rollout.engine import upstream

LogitsProcessorOutput = upstream.get("LogitsProcessorOutput")
Sampler = upstream.get("Sampler")
SamplingMetadata = upstream.get("SamplingMetadata")


def make_sgl_jax_step(
    temperature: float, top_k: int, top_p: float
) -> Callable[[jax.Array], Callable[[int], jax.Array]]:
    """Per logits array, a function of the step number running sgl-jax's sampler on one
    device."""
    mesh = Mesh(
        np.asarray(jax.devices()[:1]).reshape(1, 1),
        ("data", "tensor"),
        axis_types=(AxisType.Explicit, AxisType.Explicit),
    )

    def factory(logits: jax.Array) -> Callable[[int], jax.Array]:
        step, args = sgl_jax_program(mesh, logits, temperature, top_k, top_p)

        def run(i: int) -> jax.Array:
            with jax.set_mesh(mesh):
                return step(*args, i)[0]

        return run

    return factory


def sgl_jax_program(
    mesh: Mesh, logits: jax.Array, temperature: float, top_k: int, top_p: float
) -> tuple[Callable, tuple]:
    """sgl-jax's jitted sampler step and its arguments but the step number, with the logits
    and every input laid out on `mesh` as sgl-jax's runner lays them out (the logits split
    over the vocabulary on the tensor axis)."""
    sampler = Sampler(nnx.Rngs(0), mesh=mesh)
    graph, state = nnx.split(sampler)

    @partial(jax.jit, static_argnames=("use_sort",))
    def step(state, logits_output, metadata, rng_step, use_sort=True):  # see the module docstring
        merged = nnx.merge(graph, state)
        rng = jax.random.fold_in(jax.random.PRNGKey(0), rng_step)
        return merged(logits_output, metadata, use_sort, rng_override=rng)

    rows, vocab = logits.shape
    # Shardings as sgl-jax's SamplingMetadata.from_schedule_batch places them.
    per_row = NamedSharding(mesh, P("data"))
    per_row_2d = NamedSharding(mesh, P("data", None))
    per_token = NamedSharding(mesh, P("data", "tensor"))
    metadata = SamplingMetadata(
        return_logprob=True,
        top_logprobs_nums=None,
        token_ids_logprobs=None,
        temperatures=jax.device_put(np.full((rows, 1), temperature, np.float32), per_row_2d),
        top_ps=jax.device_put(np.full((rows,), top_p, np.float32), per_row),
        top_ks=jax.device_put(np.full((rows,), top_k, np.int32), per_row),
        min_ps=jax.device_put(np.zeros((rows,), np.float32), per_row),
        sampling_seeds=None,
        positions=jax.device_put(np.zeros((rows,), np.int32), per_row),
        do_penalties=True,
        linear_penalty=jax.device_put(np.zeros((rows, vocab), np.float32), per_token),
    )
    output = LogitsProcessorOutput(next_token_logits=jax.device_put(logits, per_token))
    return step, (state, output, metadata)
