"""`bench weights`' `cross_host` section: one weight sync from a trainer spanning two simulated
hosts to each host's engine devices, measured from the compiled program.

Owns the measurement, run as `sgl-jax-rollout launch --processes 2 --devices-per-process 4 --
python -m sgl_jax_rollout_apps.bench.cross_host_weights MODEL_DIR RUNS` (`rollout_bench` starts
it); process 0 prints one `RESULT {...}` JSON line. The layout is the `cpu-2host` preset's:
the trainer's parameters on its fsdp 4 x tp 2 mesh over both processes' 8 devices, each host's
engine on its first 2 devices. For `engine.hosts.HostLocal`'s program (what `update_params`
runs first when the trainer spans the hosts), and for the naive alternative that replicates
every parameter on every device:
- collective bytes per device and sync (`hlo_collectives`, from the compiled program's HLO);
- the largest piece of any parameter an engine device receives, and the most bytes any engine
  device holds after the sync, against the whole model (`engine_device_bytes_vs_model`: 1 /
  the engine's device count plus the replicated norms; no device holds a full copy);
- whether every process's engine-device copy equals the checkpoint's values exactly;
- milliseconds per sync (median of RUNS after one warm-up; CPU collectives over gloo, so a
  timing only, not a TPU projection).

Must not be imported by the library: it is a benchmark.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from sgl_jax_rollout_apps.launch import initialize_from_env


def measure(model_dir: str, runs: int) -> dict:
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    import tpu_configs
    from sgl_jax_rollout.engine.hosts import HostLocal
    from sgl_jax_rollout_apps.bench.hlo_collectives import collective_bytes
    from tunix_adapter.models import load_tunix_model

    preset = tpu_configs.load("cpu-2host")
    trainer_mesh, rollout_mesh = preset.meshes()
    leaves = jax.tree_util.tree_leaves(nnx.state(load_tunix_model(model_dir, trainer_mesh)))
    own = jax.sharding.Mesh(
        np.asarray(jax.local_devices()[:1]).reshape(1, 1),
        ("fsdp", "tp"),
        axis_types=(jax.sharding.AxisType.Auto,) * 2,
    )
    reference = jax.tree_util.tree_leaves(nnx.state(load_tunix_model(model_dir, own)))
    engine_devices = list(rollout_mesh.devices.flat)
    host_local = HostLocal(engine_devices)
    program, shardings = host_local.program(leaves)
    ours = collective_bytes(program.lower(*leaves).compile().as_text())
    every = NamedSharding(trainer_mesh, PartitionSpec())
    replicate = jax.jit(lambda *xs: xs, out_shardings=(every,) * len(leaves))
    naive = collective_bytes(replicate.lower(*leaves).compile().as_text())

    moved = host_local(leaves)
    jax.block_until_ready(moved)
    exact = all(
        np.array_equal(np.asarray(got), np.asarray(want))
        for got, want in zip(moved, reference, strict=True)
    )
    on_engine = all(leaf.sharding.device_set == set(engine_devices) for leaf in moved)
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(host_local(leaves))
        seconds.append(time.perf_counter() - start)
    model_bytes = sum(leaf.nbytes for leaf in leaves)
    largest_piece = max(shard.data.nbytes for leaf in moved for shard in leaf.addressable_shards)
    held = {d: 0 for d in engine_devices}
    for leaf in moved:
        for shard in leaf.addressable_shards:
            held[shard.device] += shard.data.nbytes
    return {
        "model": model_dir,
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "trainer_mesh": dict(trainer_mesh.shape),
        "engine_devices_per_host": len(engine_devices),
        "parameters": len(leaves),
        "model_bytes": model_bytes,
        "largest_leaf_bytes": max(leaf.nbytes for leaf in leaves),
        "largest_piece_bytes": largest_piece,
        "largest_piece_vs_model": round(largest_piece / model_bytes, 4),
        "engine_device_bytes_max": max(held.values()),
        "engine_device_bytes_vs_model": round(max(held.values()) / model_bytes, 3),
        "collective_bytes_per_device": ours["max_per_call"],
        "replicate_everywhere_collective_bytes_per_device": naive["max_per_call"],
        "ratios": {
            "collective_bytes_vs_model": round(ours["max_per_call"] / model_bytes, 3),
            "replicate_everywhere_vs_ours": round(
                naive["max_per_call"] / max(ours["max_per_call"], 1), 2
            ),
        },
        "exact": exact and on_engine,
        "sync_ms": 1e3 * statistics.median(seconds),
        "runs": runs,
        "shardings_split": sum(any(s is not None for s in sh.spec) for sh in shardings),
    }


def main() -> None:
    initialize_from_env()
    import jax

    result = measure(sys.argv[1], int(sys.argv[2]))
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
