"""Cancelling one caller's engine calls from another thread.

Owns `CancelScope`, `cancel_scope` and `current`. A thread opens a scope (`with
cancel_scope() as scope:`); every `generate` and `score` call it makes inside belongs to it.
`scope.cancel(reason)`, from any thread, aborts their requests still running: each such call
raises RuntimeError naming `reason` (as `RolloutEngine.abort` does for every call of the
engine), and a call made in a cancelled scope raises before the engine is touched. What
asynchronous callers need (tunix's rollout worker cancels the tasks of its trajectories): a
cancelled caller's requests leave the running batch instead of running to their end.

Knows nothing of the requests: each call registers its state (`engine.requests`), which
watches `future`, set at the cancel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Iterator

_LOCAL = threading.local()


class CancelScope:
    def __init__(self) -> None:
        self.future: concurrent.futures.Future[str] = concurrent.futures.Future()

    @property
    def cancelled(self) -> bool:
        return self.future.done()

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Ends the scope's calls running now and refuses its later ones (idempotent: the
        first reason stays)."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.future.set_result(reason)

    def check(self) -> None:
        """RuntimeError naming the reason when cancelled."""
        if self.cancelled:
            raise RuntimeError(f"aborted: {self.future.result()} (before the call started)")


@contextlib.contextmanager
def cancel_scope(scope: CancelScope | None = None) -> Iterator[CancelScope]:
    """`scope` (a new one when None) for the engine calls this thread makes in the `with`
    block: a caller may make the scope first, to cancel it from elsewhere."""
    previous = getattr(_LOCAL, "scope", None)
    scope = _LOCAL.scope = scope or CancelScope()
    try:
        yield scope
    finally:
        _LOCAL.scope = previous


def current() -> CancelScope | None:
    """The calling thread's open scope, or None."""
    return getattr(_LOCAL, "scope", None)
