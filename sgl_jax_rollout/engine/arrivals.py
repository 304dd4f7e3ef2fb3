"""Which requests of a call the engine's scheduler is still waiting for.

Owns `Arrivals`. Upstream's tokenizer manager sends a batch's requests to the scheduler one
message each (`TokenizerManager._handle_batch_request`, `managers/tokenizer_manager.py:645-650`
at the pinned commit), and the scheduler schedules whatever has arrived at each turn of its
loop (`Scheduler.recv_requests`, `managers/scheduler.py:1259`). A call's first request or two
were then often prefilled on their own, a step before the rest: one model step more per call
(65 steps instead of 64 for 64 new tokens, without overlap; measured in 5 of 6 calls of the
benchmark's workloads). The `whole_calls` patch (`patches/scheduling.py`) holds the
scheduler, once part of a call has arrived, until the rest of it has: each call then starts
as one batch. Calls from many threads arrive the same way, a few milliseconds apart (16
one-prompt calls prefilled in 3 to 6 steps instead of 1): once some requests have arrived,
the patch also waits a moment for calls already sent (`in_transit`), so they start together.

A caller thread `expect`s a call's request ids before it sends them and `forget`s them when the
call returns or fails; the scheduler thread reports what it `received` and asks whether a call
is `incomplete` (some of its requests arrived, not all) or `in_transit` (sent, none arrived).
No sgl_jax import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable


class Arrivals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._missing: dict[int, set[str]] = {}  # call -> request ids not received yet
        self._started: set[int] = set()  # calls with at least one request received
        self._call_of: dict[str, int] = {}
        self._sent_at: dict[int, float] = {}  # calls with no request received yet
        self._next = 0

    def expect(self, rids: Iterable[str]) -> None:
        """A call is about to send these requests."""
        with self._lock:
            call, self._next = self._next, self._next + 1
            self._missing[call] = set(rids)
            self._sent_at[call] = time.monotonic()
            for rid in self._missing[call]:
                self._call_of[rid] = call

    def forget(self, rids: Iterable[str]) -> None:
        """The call of these requests returned or failed: nothing more to wait for."""
        with self._lock:
            for rid in rids:
                call = self._call_of.pop(rid, None)
                if call is not None:
                    self._missing.pop(call, None)
                    self._started.discard(call)
                    self._sent_at.pop(call, None)

    def received(self, rids: Iterable[str]) -> None:
        with self._lock:
            for rid in rids:
                call = self._call_of.get(rid)
                if call is None or call not in self._missing:
                    continue
                self._missing[call].discard(rid)
                self._started.add(call)
                self._sent_at.pop(call, None)
                if not self._missing[call]:
                    del self._missing[call]
                    self._started.discard(call)

    def incomplete(self) -> bool:
        """Whether some call has had part of its requests received, not all."""
        with self._lock:
            return bool(self._started)

    def in_transit(self, within_s: float) -> bool:
        """Whether some call sent its requests less than `within_s` ago and none has arrived
        (a call that never arrives, its submission having failed, is not waited for long)."""
        since = time.monotonic() - within_s
        with self._lock:
            return any(sent > since for sent in self._sent_at.values())
