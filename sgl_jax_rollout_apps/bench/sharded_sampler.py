"""`bench sampler`'s `sharded` section: what one sampler step moves between devices and what
each device reads and computes, under tensor parallelism, from compiled programs (not time).

Owns the measurement, run in a process of its own with 8 simulated CPU devices
(`python -m sgl_jax_rollout_apps.bench.sharded_sampler [VOCAB]` prints one JSON line; XLA_FLAGS
must be set before jax starts, so `sampler_bench` starts it as a subprocess). For batch 64 and
256 at `bench sampler`'s vocabulary (151,936 unless given) on tp = 4 and 8 (mesh `data` 1 x
`tensor` tp, logits split over the vocabulary as the LM head leaves them), `bench sampler`'s
`full` settings, three programs:
- `sgl_jax`: sgl-jax's own `Sampler` (when sgl_jax is importable);
- `ours_gathered`: our sampler after a reshard of the logits to `P("data", None)`, as the
  engine ran it before the vocabulary-parallel sampler (and runs it with it turned off);
- `ours_vocab_parallel`: `sample_vocab_parallel`.
Each: collective bytes per device and call (`hlo_collectives`: the cheapest and the costliest
path through the program's conditionals) and XLA's cost analysis of the partitioned program
(bytes accessed and flops per device), beside `single_device` (`sample` on one device).

Must not be imported by the library: it is a benchmark.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import json
import sys

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sgl_jax_rollout.sampling import SamplerConfig, SamplerOutput, sample
from sgl_jax_rollout.sampling.vocab_parallel import output_specs, sample_vocab_parallel
from sgl_jax_rollout_apps.bench.hlo_collectives import collective_bytes
from sgl_jax_rollout_apps.bench.sampler_bench import (
    DEFAULT_VOCAB,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    _batches,
    _options,
)

BATCH_SIZES = (64, 256)
TENSOR_PARALLEL = (4, 8)


def measure(vocab: int = DEFAULT_VOCAB) -> dict:
    config = SamplerConfig()  # bench sampler's `full`
    upstream = _sgl_jax_program_factory()
    out: dict = {
        "vocab": vocab,
        "settings": "bench sampler's full (penalties, processed logprob, full raw entropy, "
        "top-k / top-p draw); logits f32 split over the tensor axis",
        "unit": "bytes per device and call; flops per device",
    }
    for rows in BATCH_SIZES:
        batch = _batches(rows, _options(penalties=True), 1, seed=rows, vocab=vocab)[0]
        logits = np.zeros((rows, vocab), np.float32)
        single = _cost(sample.lower(logits, batch, config).compile())
        by_tp: dict = {"single_device": single}
        for tp in TENSOR_PARALLEL:
            mesh = Mesh(
                np.asarray(jax.devices()[:tp]).reshape(1, tp),
                ("data", "tensor"),
                axis_types=(AxisType.Explicit, AxisType.Explicit),
            )
            split = jax.device_put(logits, NamedSharding(mesh, P("data", "tensor")))
            rows_batch = jax.device_put(batch, NamedSharding(mesh, P()))
            programs = {
                "ours_gathered": _gathered(mesh, config).lower(split, rows_batch),
                "ours_vocab_parallel": sample_vocab_parallel.lower(
                    split, rows_batch, config, mesh=mesh, batch_axis="data"
                ),
            }
            if upstream is not None:
                step, args = upstream(mesh, logits, TEMPERATURE, TOP_K, TOP_P)
                with jax.set_mesh(mesh):
                    programs["sgl_jax"] = step.lower(*args, 0)
            entry = {}
            for name, lowered in programs.items():
                compiled = lowered.compile()
                entry[name] = {**collective_bytes(compiled.as_text()), **_cost(compiled)}
            ours = entry["ours_vocab_parallel"]
            entry["ratios"] = {
                "gathered_vs_vocab_parallel_collective_bytes": round(
                    entry["ours_gathered"]["max_per_call"] / max(ours["max_per_call"], 1), 1
                ),
                "vocab_parallel_bytes_vs_single_over_tp": round(
                    ours["bytes_accessed"] / (single["bytes_accessed"] / tp), 3
                ),
                "vocab_parallel_flops_vs_single_over_tp": round(
                    ours["flops"] / (single["flops"] / tp), 3
                ),
            }
            by_tp[f"tp{tp}"] = entry
        out[str(rows)] = by_tp
    return out


def _gathered(mesh: Mesh, config: SamplerConfig):
    """Our sampler on logits gathered to `P("data", None)` (the engine's path without the
    vocabulary-parallel sampler: a reshard, then the sampler in auto-sharding mode)."""
    rows = NamedSharding(mesh, P("data"))
    specs = output_specs(config, "data")
    shardings = jax.tree.map(lambda _: rows, specs, is_leaf=lambda x: isinstance(x, P))

    @jax.jit
    def step(logits, batch) -> SamplerOutput:
        logits = jax.sharding.reshard(logits, NamedSharding(mesh, P("data", None)))
        run = jax.sharding.auto_axes(lambda x, b: sample(x, b, config), out_sharding=shardings)
        return run(logits, batch)

    return step


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {"bytes_accessed": int(cost["bytes accessed"]), "flops": int(cost["flops"])}


def _sgl_jax_program_factory():
    try:
        from sgl_jax_rollout_apps.bench.sgl_jax_sampler import sgl_jax_program
    except ImportError:
        return None
    return sgl_jax_program


def main() -> None:
    if jax.device_count() < max(TENSOR_PARALLEL):
        sys.exit(f"needs {max(TENSOR_PARALLEL)} devices, found {jax.device_count()}")
    vocab = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_VOCAB
    print("RESULT " + json.dumps(measure(vocab)))


if __name__ == "__main__":
    main()
