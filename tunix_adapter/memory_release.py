"""Memory release hand-offs: the rollout engine frees its memory for the trainer's update.

Where the rollout shares the actor's devices, its engine frees its KV pool (or also its
weights) before each trainer update and takes it back at its next call. Owns the option's
values (`RELEASES`), `build_cluster`'s reading of its `release_rollout_memory` option
(`release_option`: True means "kv" where the devices are shared) and the release itself
(`release_for_update`, which logs the bytes; `RolloutCluster` calls it before each update and
buffers them as `rollout/memory_released_bytes`). A rollout call before the next weight sync
(a step's next mini-batch; async loading) gets the weights of the last sync back from tunix's
anchor state, the behaviour policy tunix expects; the sync itself brings the new ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

RELEASES = (None, "kv", "weights")


def release_option(option: str | bool | None, rollout: str, shared: bool) -> str | None:
    """`build_cluster`'s `release_rollout_memory` as `RolloutCluster` takes it."""
    if option is True:
        return "kv" if shared and rollout == "sglang_jax" else None
    if option in (False, None):
        return None
    if option not in RELEASES:
        raise ValueError(
            f"release_rollout_memory must be True, False, None or one of {RELEASES[1:]}, got "
            f"{option!r}"
        )
    if rollout != "sglang_jax" or not shared:
        raise ValueError(
            f"release_rollout_memory={option!r} needs the sglang_jax rollout on the actor's "
            f"devices (here: rollout {rollout!r}, shared devices {shared}): a rollout on "
            "devices of its own frees nothing the trainer can use"
        )
    return option


def release_for_update(
    rollout: Any, option: str | None, restore: Callable[[], Any]
) -> dict[str, int] | None:
    """Frees the rollout engine's memory for the trainer's update as `option` says ("kv" or
    "weights", whose `restore` gives the engine back the weights of the last sync); None where
    `option` is None or the engine has released already (once per update run: the next
    rollout call takes it back). Returns the bytes freed."""
    if option is None or rollout.engine.released:
        return None
    weights = option == "weights"
    freed = rollout.release_memory(
        weights=weights, resume_on_use=True, restore=restore if weights else None
    )
    logger.info(
        "rollout engine released %.1f MiB for the trainer's update (KV pool %.1f, "
        "weights %.1f); it resumes at its next call",
        (freed["kv_bytes"] + freed["weight_bytes"]) / 2**20,
        freed["kv_bytes"] / 2**20,
        freed["weight_bytes"] / 2**20,
    )
    return freed
