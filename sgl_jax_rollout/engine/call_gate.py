"""Admission to the running engine: serving calls together, exclusive jobs alone.

Owns `CallGate`, the one place where caller threads wait for each other:

- `serving(mode)`: `generate` and `score` calls. Any number of one mode run at once, their
  requests in the engine's running batch together (continuous batching across calls). A
  `generate` call's mode is its sampler output mode: the sampler's static config is chosen
  per engine batch, and rows of one batch must share it (`rows.sampler_config`). Scoring has
  a mode of its own (`SCORING_MODE`), so its requests never share a prefill with generation
  ones: upstream reads the input logprobs of such a batch at the wrong offsets (every
  request that asks for none still gets its positions in the batch's input logprobs,
  `schedule_batch.py:1249-1256`, but only those that ask move the read offset,
  `scheduler_output_processor_mixin.py:245-259`, sgl-jax cddbf6f1).
- `exclusive()`: weight swaps, memory release and resume, teardown. It waits until every
  call admitted before it has returned, and calls that arrive after it wait until it is done,
  as tunix's `RolloutSyncLock` holds rollouts back while weights sync: no completion is ever
  sampled under two weight versions.

Admission is first come, first served: a caller that cannot enter yet (an exclusive job while
calls run, a call whose mode differs from the running calls') holds back everyone behind it,
so a stream of calls of one mode never starves a weight sync or a call of another mode.

Must not know what the calls do: it admits and counts, nothing else. No sgl_jax import.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Hashable, Iterator

SCORING_MODE = "scoring"  # `score` calls: prefill-only requests with input logprobs


@dataclasses.dataclass(eq=False)
class _Ticket:
    mode: Hashable
    exclusive: bool


class CallGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[_Ticket] = collections.deque()  # waiting, in order
        self._serving: collections.Counter = collections.Counter()  # mode -> calls admitted
        self._exclusive = False

    def serving(self, mode: Hashable) -> contextlib.AbstractContextManager[None]:
        """Admits a serving call of sampler output mode `mode` for the `with` block."""
        return self._held(_Ticket(mode, exclusive=False))

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """Runs the `with` block with no serving call admitted."""
        return self._held(_Ticket(None, exclusive=True))

    @contextlib.contextmanager
    def _held(self, ticket: _Ticket) -> Iterator[None]:
        self._enter(ticket)
        try:
            yield
        finally:
            self._leave(ticket)

    def serving_calls(self) -> int:
        """Calls admitted now (read by tests and `bench concurrency`)."""
        with self._cond:
            return sum(self._serving.values())

    def waiting(self) -> int:
        """Callers waiting to be admitted now (read by tests)."""
        with self._cond:
            return len(self._queue)

    def _admissible(self, ticket: _Ticket) -> bool:
        if self._exclusive:
            return False
        if ticket.exclusive:
            return not self._serving
        return set(self._serving) <= {ticket.mode}

    def _enter(self, ticket: _Ticket) -> None:
        with self._cond:
            self._queue.append(ticket)
            try:
                while not (self._queue[0] is ticket and self._admissible(ticket)):
                    self._cond.wait()
            except BaseException:  # interrupted while waiting: those behind may go now
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            if ticket.exclusive:
                self._exclusive = True
            else:
                self._serving[ticket.mode] += 1
            self._cond.notify_all()  # the next in line may be admissible too

    def _leave(self, ticket: _Ticket) -> None:
        with self._cond:
            if ticket.exclusive:
                self._exclusive = False
            else:
                self._serving[ticket.mode] -= 1
                if not self._serving[ticket.mode]:
                    del self._serving[ticket.mode]
            self._cond.notify_all()
