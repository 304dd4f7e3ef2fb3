"""Lifecycle: the engine's threads, sockets and idle turns tied to the engine that made them,
so a shutdown reaches all of them (catalog: `patches/__init__.py`).

Owns `install` for `scheduler_of_engine`, `runner_of_engine`, `engine_sockets`,
`idle_wait_and_stop` and `paused_waits`.
"""

from __future__ import annotations

import zmq

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.patches.hooks import IDLE_WAIT_MS, current, wrap


def install() -> None:
    get = upstream.get
    for path in upstream.SOCKET_MODULES:
        wrap(upstream.module(path), "get_zmq_socket", _engine_socket)
    wrap(get("Scheduler"), "__init__", _scheduler_of_engine)
    wrap(get("ModelRunner"), "__init__", _runner_of_engine)
    wrap(get("Scheduler"), "on_idle", _idle_wait_and_stop)
    wrap(get("Scheduler"), "process_input_requests", _paused_waits)


def _scheduler_of_engine(original, self, *args, **kwargs):
    """scheduler_of_engine: tie the scheduler to the engine building it before anything of it
    runs (its watchdog starts inside `__init__`), so a shutdown reaches it from any state."""
    hooks = current()
    self._sgl_jax_rollout_hooks = hooks
    if hooks is not None:
        hooks.scheduler = self
    original(self, *args, **kwargs)


def _runner_of_engine(original, self, *args, **kwargs):
    """runner_of_engine: tie the model runner to the engine building it, so a step still
    queued on the overlap forward thread when the engine stops runs with its own hooks."""
    self._sgl_jax_rollout_hooks = current()
    original(self, *args, **kwargs)


def _engine_socket(original, *args, **kwargs):
    """engine_sockets: the upstream socket, with LINGER 0, recorded for shutdown."""
    socket = original(*args, **kwargs)
    socket.setsockopt(zmq.LINGER, 0)
    hooks = current()
    if hooks is not None:
        hooks.sockets.append(socket)
    return socket


def _paused_waits(original, self, *args, **kwargs):
    """paused_waits: a scheduler paused in place waits on its sockets; it leaves its loop on
    shutdown."""
    result = original(self, *args, **kwargs)
    hooks = getattr(self, "_sgl_jax_rollout_hooks", None)
    if hooks is None or not self._engine_paused:
        return result
    if hooks.stop.is_set():
        raise SystemExit  # as idle_wait_and_stop: on_idle never runs while paused
    _wait_on_sockets(self, hooks)
    return result


def _idle_wait_and_stop(original, self, *args, **kwargs):
    """idle_wait_and_stop: run idle work, wait on the sockets; leave the loop on shutdown."""
    result = original(self, *args, **kwargs)
    hooks = getattr(self, "_sgl_jax_rollout_hooks", None)
    if hooks is None:
        return result
    if hooks.stop.is_set():
        raise SystemExit  # ends this scheduler thread quietly (threading ignores SystemExit)
    if not self.is_fully_idle():
        return result
    hooks.idle_work.run_pending(self)
    _wait_on_sockets(self, hooks)
    # Still fully idle: new messages stay in the sockets until the next loop iteration.
    hooks.idle_work.run_pending(self)
    return result


def _wait_on_sockets(scheduler, hooks) -> None:
    """Up to IDLE_WAIT_MS, until a message reaches the scheduler or idle work is queued."""
    sockets = [getattr(scheduler, n, None) for n in ("recv_from_tokenizer", "recv_from_rpc")]
    poller = zmq.Poller()
    for sock in sockets:
        if sock is not None:
            poller.register(sock, zmq.POLLIN)
    poller.register(hooks.idle_work.fileno(), zmq.POLLIN)
    poller.poll(IDLE_WAIT_MS)
