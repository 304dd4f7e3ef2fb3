"""Trainer-side batches with one JAX process per host: every process holds its own share of
the batch (what its rollout sampled), the trainer's arrays span every host.

Owns:
- `global_batch(arrays, mesh, axes)`: each process's share assembled into one global array
  per input, sharded as tunix's `shard_input` shards (`PartitionSpec(*axes)`,
  `make_array_from_process_local_data`: process by process in mesh order);
- `widest(width)`: the largest of every process's widths, so their shares can be padded alike;
- `all_values(values)`: every process's 1-D values, in process order (a batch-wide statistic,
  such as a quantile, must see them all);
- `local_rows(array, rows)`: this process's rows of a result over the global batch, read from
  its own shards (no collective).

With one process each returns its input (as numpy, for `local_rows` and `all_values`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def global_batch(arrays: list[Any], mesh: Mesh, axes: tuple[str, ...]) -> list[Any]:
    """Global arrays whose rows are every process's `arrays` rows in process order, split over
    the mesh `axes` on the batch axis. Every process must call it at the same time."""
    if jax.process_count() == 1:
        return list(arrays)
    sharding = NamedSharding(mesh, PartitionSpec(*axes))
    with jax.transfer_guard("allow"):
        return [jax.make_array_from_process_local_data(sharding, np.asarray(x)) for x in arrays]


def widest(width: int) -> int:
    """The largest `width` over every process (one collective; `width` itself in one)."""
    if jax.process_count() == 1:
        return width
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray([width], np.int32))))


def all_values(values: np.ndarray) -> np.ndarray:
    """Every process's `values` (1-D, any length each), concatenated in process order. Every
    process must call it at the same time."""
    values = np.asarray(values)
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    counts = multihost_utils.process_allgather(np.asarray([values.size], np.int32)).reshape(-1)
    padded = np.zeros(int(counts.max()), values.dtype)
    padded[: values.size] = values
    gathered = multihost_utils.process_allgather(padded).reshape(len(counts), -1)
    return np.concatenate([row[:count] for row, count in zip(gathered, counts, strict=True)])


def local_rows(array: Any, rows: int) -> np.ndarray:
    """This process's `rows` rows of a result over the global batch (rows `index * rows ...`),
    read from this process's shards (no collective). A result of `rows` rows (one process, or
    a process-local result) is returned whole."""
    index, count = jax.process_index(), jax.process_count()
    if array.shape[0] == rows:
        return np.asarray(array)
    if array.shape[0] != rows * count:
        raise ValueError(
            f"a result of {array.shape[0]} rows is neither this process's {rows} rows nor the "
            f"global batch of {count} processes x {rows}"
        )
    start = index * rows
    out = np.empty((rows, *array.shape[1:]), array.dtype)
    filled = np.zeros(rows, bool)
    for shard in array.addressable_shards:
        first, last, _ = shard.index[0].indices(array.shape[0]) if shard.index else (0, 0, 1)
        lo, hi = max(first, start), min(last, start + rows)
        if lo < hi:
            block = np.asarray(shard.data)[lo - first : hi - first]
            out[(slice(lo - start, hi - start), *shard.index[1:])] = block
            filled[lo - start : hi - start] = True
    if not filled.all():
        raise ValueError(
            f"rows {start}..{start + rows - 1} of the global batch are not on process {index}'s "
            "devices: the trainer's batch axis must keep each process's share on its own devices"
        )
    return out
