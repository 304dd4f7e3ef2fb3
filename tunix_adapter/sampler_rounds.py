"""The weight-sync rounds of tunix main's rollout worker, as `SglangJaxSampler` keeps them.

Owns `SyncRounds`: one round at a time, keyed as tunix's worker keys it
(`extra_config["req_id"]`, `extra_config["uuid"]` of the `WeightSyncRequest`,
`experimental/worker/rollout_worker.py` `_record_round` at c7d8950f), through the phases
tunix reports: "prepared" (`pre_weight_sync`), "h2d_done" (`weight_sync`: the new weights
staged, the engine untouched), then "committed" (`post_weight_sync` swapped them in) or
"aborted" (`abort_weight_sync`: the staged weights dropped, the previous ones still serving,
bit for bit, since nothing reached the engine). A phase delivered twice for the same round
does nothing; a phase out of order raises RuntimeError naming the round and its phase; a
`pre_weight_sync` of a new round while another is open drops that one's staged weights
(tunix c7d8950f's worker never tells the sampler of an abort: `abort_weight_sync`,
`rollout_worker.py:488-494`, reopens its own admission alone).

Pure bookkeeping under a lock: the sampler does the waiting and the swap.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

OPEN = ("prepared", "h2d_done")


class SyncRounds:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[Any, Any] | None = None
        self._phase = "idle"
        self._target: int | None = None
        self._staged: Any = None
        self.policy_version = 0  # the version serving: 0 until the first commit

    def prepare(self, request: Any) -> bool:
        """Opens `request`'s round; False when it is open already (a repeated delivery)."""
        key = round_key(request)
        with self._lock:
            if key == self._key and self._phase in OPEN:
                return False
            if self._phase in OPEN:
                logger.warning(
                    "weight-sync round %s left in phase %s: round %s starts; its staged "
                    "weights are dropped",
                    self._key,
                    self._phase,
                    key,
                )
            self._key, self._phase, self._staged = key, "prepared", None
            self._target = getattr(request, "policy_version", None)
            return True

    def stage(self, request: Any, weights: Any) -> bool:
        """Holds `weights` for `request`'s round; False when they are held already."""
        with self._lock:
            self._expect(request, "weight_sync", ("prepared", "h2d_done"), "pre_weight_sync")
            if self._phase == "h2d_done":
                return False
            self._phase, self._staged = "h2d_done", weights
            return True

    def to_commit(self, request: Any) -> Any:
        """The weights `request`'s round staged, to swap in; None when it committed already."""
        with self._lock:
            self._expect(request, "post_weight_sync", ("h2d_done", "committed"), "weight_sync")
            return None if self._phase == "committed" else self._staged

    def committed(self, request: Any) -> int:
        """Records the swap; returns the policy version now serving: the request's
        `policy_version` where it is above the last one, else the last one + 1."""
        with self._lock:
            self._expect(request, "post_weight_sync", ("h2d_done",), "weight_sync")
            target = self._target
            above = isinstance(target, int) and target > self.policy_version
            self.policy_version = target if above else self.policy_version + 1
            self._phase, self._staged = "committed", None
            return self.policy_version

    def abort(self, request: Any) -> bool:
        """Drops `request`'s round (a round not seen yet is recorded as aborted); False when
        it was aborted already."""
        key = round_key(request)
        with self._lock:
            if key == self._key and self._phase == "committed":
                raise RuntimeError(
                    f"abort_weight_sync: round {key} is committed, its weights serve (an "
                    "abort restores the previous weights only before post_weight_sync)"
                )
            if key == self._key and self._phase == "aborted":
                return False
            if key != self._key and self._phase in OPEN:
                raise RuntimeError(
                    f"abort_weight_sync for weight-sync round {key}: round {self._key} is "
                    f"open (phase {self._phase!r}); abort that one"
                )
            self._key, self._phase, self._staged = key, "aborted", None
            return True

    def report(self) -> dict[str, Any]:
        with self._lock:
            req_id, uuid = self._key or (None, None)
            return {
                "req_id": req_id,
                "uuid": uuid,
                "phase": self._phase,
                "policy_version": self.policy_version,
            }

    def _expect(self, request: Any, call: str, phases: tuple[str, ...], before: str) -> None:
        key = round_key(request)
        if key != self._key or self._phase not in phases:
            raise RuntimeError(
                f"{call} for weight-sync round {key}: {before} must run first; this sampler's "
                f"round is "
                f"{self._key}, phase {self._phase!r} (allowed: {', '.join(phases)})"
            )


def round_key(request: Any) -> tuple[Any, Any]:
    """A round's key, as tunix's worker records it: `extra_config`'s req_id and uuid."""
    extra = getattr(request, "extra_config", None) or {}
    return extra.get("req_id"), extra.get("uuid")
