"""The sgl-jax engine inside this process: its start, its idle scheduler thread, its end.

Owns `EngineProcess`: starting sgl-jax in single-process mode (our patches applied and
activated, the process's signal handlers and root log level kept, upstream's atexit hook
dropped), the handles
the rest of `RolloutEngine` reads (the upstream `Engine`, its scheduler, model runner and
`weights.WeightSwapper`), work run on the scheduler thread while it is fully idle
(`when_idle`), and taking all of it down again (`shutdown`, `teardown`).

Must not touch any other process: upstream's `Engine.shutdown` signals every child process
of the trainer, so it is never called; only the engine's own threads and sockets are stopped.
Serves no request (`engine.requests`) and holds no memory state (`engine.memory_lifecycle`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import logging
import signal
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import FIRST_COMPLETED
from pathlib import Path
from typing import Any

import zmq

from sgl_jax_rollout.engine import patches, upstream
from sgl_jax_rollout.engine.call_gate import CallGate
from sgl_jax_rollout.engine.lora import LoraLayout

logger = logging.getLogger(__name__)

SCHEDULER_THREAD_PREFIX = "sglang::scheduler"
DETOKENIZER_THREAD_PREFIX = "sglang-jax::detokenizer"
STOP_TIMEOUT_S = 30.0
TOKENIZER_WORKAROUND = "Created patched tokenizer config workaround"  # sgl-jax's warning


class EngineProcess:
    """One started sgl-jax engine (or what a failed start left of it) and its teardown.

    `gate` is the engine's admission: a shutdown runs as its exclusive job, so it waits for the
    running calls (which `hooks.ended` wakes) and never tears down under a step."""

    def __init__(self, hooks: patches.EngineHooks, gate: CallGate) -> None:
        self.hooks = hooks
        self._gate = gate
        self._ending = threading.Lock()  # one shutdown at a time
        self.engine = None
        self.scheduler = None
        self.model_runner = None
        self.weights = None  # the model's WeightSwapper

    def start(self, server_args: dict[str, Any], model_type: str, lora: LoraLayout | None) -> float:
        """Starts sgl-jax and returns the seconds it took; on any failure, whatever was started
        is stopped again (threads, sockets, signal handlers, the process's engine slot) before
        the error propagates."""
        patches.apply(server_args)
        patches.activate(self.hooks, STOP_TIMEOUT_S)
        atexit.register(self.shutdown)
        started = time.perf_counter()
        try:
            self._start(server_args, model_type, lora)
        except BaseException as err:
            reason = self.hooks.ended.result() if self.hooks.ended.done() else None
            self.teardown("the engine failed to start")
            if reason is not None:
                raise RuntimeError(f"the sgl-jax engine failed to start: {reason}") from (
                    self.hooks.error or err
                )
            raise
        self.hooks.on_fault = self._shut_down_after_fault
        return time.perf_counter() - started

    def _start(self, server_args: dict[str, Any], model_type: str, lora: LoraLayout | None) -> None:
        from sgl_jax_rollout.engine.weights import WeightSwapper

        engine_class = upstream.get("Engine")
        # sgl-jax's tokenizer, scheduler and detokenizer each load the tokenizer through a
        # patched copy of its config (for the installed transformers) and warn each time, with
        # a new temporary path: noise a user cannot act on, said once at debug level instead.
        warnings.filterwarnings("ignore", message=TOKENIZER_WORKAROUND, category=UserWarning)
        logger.debug("sgl-jax loads the tokenizer through a patched config (its warning hidden)")

        # Built in two steps so that a failing __init__ still leaves the object to clean up.
        engine = engine_class.__new__(engine_class)
        self.engine = engine
        with _signal_handlers_kept(), _root_log_level_kept():
            try:
                engine.__init__(**server_args)
            finally:
                # Upstream registers Engine.shutdown, which SIGKILLs every child process.
                atexit.unregister(engine.shutdown)
        if self.hooks.ended.done():  # a thread failed while the engine started
            raise RuntimeError(self.hooks.ended.result())
        self.scheduler = upstream.scheduler_of(engine)
        self.model_runner = upstream.model_runner_of(self.scheduler)
        self.weights = WeightSwapper(self.model_runner, model_type, lora)

    def abort_requests(self, rids: Sequence[str] | None = None) -> None:
        """Aborts the requests `rids` (every request when None) through upstream's
        `Engine.abort_request`, on the engine's own event loop (`on_engine_loop`)."""
        engine = self.engine

        async def send() -> None:
            if rids is None:
                engine.abort_request(abort_all=True)
            for rid in rids or ():
                engine.abort_request(rid=rid)

        if engine is not None:
            self.on_engine_loop(send)

    def on_engine_loop(self, make: Callable[[], Awaitable[Any]]) -> Any:
        """The result of `await make()`, run on the engine's own event loop and waited for.

        What reaches upstream's tokenizer manager goes through here: it sends on `zmq.asyncio`
        sockets, whose send asks the calling thread for its event loop
        (`TokenizerManager.abort_request`, `managers/tokenizer_manager.py:713-717` at
        cddbf6f1). From a thread that has none (any thread but the main one, or the main
        thread once `asyncio.run` has ended there) an abort raised RuntimeError and its
        requests ran on. On the engine's loop it finds that loop, and the sockets, which are
        not thread-safe, are used by that one thread only (every request is sent there)."""
        loop = self.engine.loop
        if not loop.is_running():
            raise RuntimeError("the engine's event loop is not running")
        return asyncio.run_coroutine_threadsafe(make(), loop).result(STOP_TIMEOUT_S)

    def check_open(self) -> None:
        if self.hooks.ended.done():
            raise RuntimeError(self.hooks.ended.result())

    def when_idle(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(scheduler)` run on the scheduler thread once it is fully idle; its result."""
        future = self.hooks.idle_work.submit(fn)
        concurrent.futures.wait([future, self.hooks.ended], STOP_TIMEOUT_S, FIRST_COMPLETED)
        if future.done() or not future.cancel():
            return future.result()
        if self.hooks.ended.done():
            raise RuntimeError(f"{self.hooks.ended.result()}; the idle work was not done")
        raise RuntimeError(
            f"the engine's scheduler did not become idle within {STOP_TIMEOUT_S:.0f}s"
        )

    def _shut_down_after_fault(self, reason: str) -> None:
        """Called on the failing engine thread: shut down from a thread of our own, which
        waits for the running calls to leave (they are woken by `ended`)."""
        threading.Thread(target=self.shutdown, name="sgl-jax-rollout-shutdown", daemon=True).start()

    def shutdown(self) -> None:
        """`RolloutEngine.shutdown`."""
        with self._ending:
            if self.engine is None and self.hooks.released.is_set():
                return
            self.hooks.end("the rollout engine was shut down")
            with self._gate.exclusive():
                self.teardown("the rollout engine was shut down")

    def teardown(self, reason: str) -> None:
        """Takes down whatever was started, from any state of construction.

        Reads upstream attributes (commit in `availability.PINNED_COMMIT`): the scheduler
        leaves its loop at the next idle check (`patches` idle_wait_and_stop); with overlap,
        the forward thread then runs what was queued and ends (`_stop_forward_thread`,
        else it would keep the model alive for the life of the process); the detokenizer
        thread, blocked on its socket, gets a message whose unpickling raises
        SystemExit (any Exception there would be an engine fault); then every socket the
        engine made (`patches` engine_sockets) is closed with linger 0, so neither
        interpreter exit nor a later garbage collection ever waits on a zmq context.
        """
        hooks, engine = self.hooks, self.engine
        hooks.end(reason)
        if getattr(engine, "loop", None) is not None:
            with contextlib.suppress(Exception):
                self.abort_requests()
        patches.deactivate(hooks)  # sets stop: the scheduler and our watchdog leave their loops
        _join_threads(SCHEDULER_THREAD_PREFIX)
        if hooks.scheduler is not None and not _stop_forward_thread(
            hooks.scheduler, STOP_TIMEOUT_S
        ):
            logger.warning("the overlap scheduler's forward thread did not stop")
        hooks.idle_work.close()
        port_args = getattr(engine, "port_args", None) if engine is not None else None
        if port_args is not None and _alive(DETOKENIZER_THREAD_PREFIX):
            _stop_detokenizer(port_args.detokenizer_ipc_name)
        loop = getattr(engine, "loop", None) if engine is not None else None
        if loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop).result(STOP_TIMEOUT_S)
            finally:
                loop.call_soon_threadsafe(loop.stop)
        # Every socket, the detokenizer's above all (upstream never closes them): an engine
        # context finalised later with an open socket would hang the collecting thread.
        for sock in hooks.sockets:
            if not sock.closed:
                sock.close(linger=0)
        hooks.sockets.clear()
        hooks.scheduler = None
        if port_args is not None:  # upstream's PortArgs made them with delete=False
            for value in dataclasses.asdict(port_args).values():
                if isinstance(value, str) and value.startswith("ipc://"):
                    Path(value.removeprefix("ipc://")).unlink(missing_ok=True)
        atexit.unregister(self.shutdown)
        self.scheduler = None
        self.model_runner = None
        self.weights = None
        self.engine = None


class _ExitThread:
    """Unpickled by a thread blocked in `recv_pyobj`, it ends that thread quietly."""

    def __reduce__(self):
        return (sys.exit, (0,))


def _join_threads(prefix: str) -> None:
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread is not threading.current_thread():
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                logger.warning("engine thread %s did not stop", thread.name)


def _stop_detokenizer(endpoint: str) -> None:
    """The detokenizer thread blocks on its socket: send it `_ExitThread` from a socket of
    our own (the scheduler's may not exist when a start failed half-way)."""
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    try:
        sock.connect(endpoint)
        sock.send_pyobj(_ExitThread())
        _join_threads(DETOKENIZER_THREAD_PREFIX)
    finally:
        sock.close(linger=0)
        context.term()


def _stop_forward_thread(scheduler: Any, wait_s: float) -> bool:
    """Ends the overlap scheduler's forward thread (`ModelWorkerClient.forward_thread_func_`
    leaves its loop on an empty batch; upstream never sends one) once the steps queued before
    it have run; False if it is still alive after `wait_s`. Without overlap, or before the
    scheduler made its worker (a failed start): nothing to do."""
    worker = getattr(scheduler, "tp_worker", None)
    if not isinstance(worker, upstream.get("ModelWorkerClient")):
        return True
    worker.input_queue.put((None, None, None, None))
    worker.forward_thread.join(wait_s)
    return not worker.forward_thread.is_alive()


def _alive(prefix: str) -> bool:
    return any(t.name.startswith(prefix) for t in threading.enumerate())


async def _cancel_tasks() -> None:
    """Cancels the tokenizer manager's tasks (on the engine's loop)."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _root_log_level_kept():
    """Gives what sgl-jax sets on the process's root logger (`configure_logger`,
    `utils/common_utils.py:234-270` at cddbf6f1: the level `EngineSettings.log_level`, "error"
    by default, and a stream handler) to sgl-jax's own loggers instead, and restores the
    root's: on the root, the level silenced every warning of the process, ours (an over-long
    prompt cut) and the user's, and the handler printed each record twice where the process
    had one already (the CLI's)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        added = [h for h in root.handlers if h not in handlers]
        own = logging.getLogger("sgl_jax")
        if root.level != level and own.level == logging.NOTSET:
            own.setLevel(root.level)
        root.setLevel(level)
        for handler in added:
            root.removeHandler(handler)
            own.addHandler(handler)
        if added:  # sgl-jax's records go to its handler alone
            own.propagate = False


@contextlib.contextmanager
def _signal_handlers_kept():
    """Restores the process's SIGQUIT and SIGCHLD handlers after sgl-jax starts. Upstream's
    (`entrypoints/engine.py::_set_envs_and_config`) kill the whole process tree on SIGQUIT and
    reap any child process of the trainer on SIGCHLD (`subprocess` then loses its exit codes).
    The SIGQUITs sgl-jax's own threads send are engine faults instead (`patches`
    contained_signals)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGQUIT, signal.SIGCHLD)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
