"""What every patch shares: the running engine's hooks, and how a patch is installed.

Owns `EngineHooks` (what the patches need from the running engine; one engine per process at
a time: `activate`, `deactivate`, `current`), `wrap` / `wrap_classmethod` (a patch wraps the
upstream function, never copies it, once per process), and the request helpers several kinds
use (`requests_by_row`, `batch_requests`, `fail_requests`). The catalog of patches is
`patches/__init__.py`'s docstring.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.arrivals import Arrivals
from sgl_jax_rollout.engine.collector import Collector
from sgl_jax_rollout.engine.idle_work import IdleWork
from sgl_jax_rollout.engine.numerics import TrainerRounding
from sgl_jax_rollout.engine.slot_state import SlotState
from sgl_jax_rollout.sampling.batch import SamplerConfig

logger = logging.getLogger("sgl_jax_rollout.engine.patches")

# How long an idle scheduler waits on its sockets per turn (idle_wait_and_stop), and the
# poll step of whole_calls.
IDLE_WAIT_MS = 50


_MARK = "__sgl_jax_rollout_patch__"


_END_LOCK = threading.Lock()


@dataclasses.dataclass
class EngineHooks:
    """What the patches need from the running engine (one engine per process at a time).

    `ended` resolves (to the reason, a sentence) when the engine can serve no more: shut down,
    or stopped by a fault of its own threads (`fault`). Callers wait on it beside their
    request, so neither a shutdown nor a dead scheduler leaves them waiting forever.
    """

    collector: Collector
    valid_vocab_size: int | None
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    idle_work: IdleWork = dataclasses.field(default_factory=IdleWork)
    arrivals: Arrivals = dataclasses.field(default_factory=Arrivals)
    sockets: list = dataclasses.field(default_factory=list)  # every socket the engine made
    ended: Future = dataclasses.field(default_factory=Future)
    released: threading.Event = dataclasses.field(default_factory=threading.Event)
    on_fault: Callable[[str], None] | None = None
    error: BaseException | None = None  # the exception behind a fault, when there was one
    scheduler: Any = None
    neutral_rows: bool = False  # set while a failed step is re-run with neutral rows
    detokenizer_states: int = 0  # decode states the detokenizer held after its last batch
    sampler_configs: tuple[SamplerConfig, ...] = ()  # compiled at start besides the default
    vocab_parallel: bool = False  # the sampler runs on vocabulary-split logits (tp > 1)
    native_attention: str = "paged"  # EngineSettings.native_attention
    rope_phases: str = "inv_freq"  # the rope_phases.py rule EngineSettings.rope_phases gives
    # what EngineSettings.numerics rounds as the trainer does (numerics.py)
    numerics: TrainerRounding = dataclasses.field(default_factory=TrainerRounding)
    precompiling: bool = False  # set while upstream precompiles
    slot_state: SlotState | None = None  # the sampler's device state, owned by the step thread
    # (the step's request ids, error) of sampler calls that failed: the scheduler thread fails
    # them when it processes that step.
    failed_samples: collections.deque = dataclasses.field(default_factory=collections.deque)
    processing: Any = None  # (scheduler, batch) while an overlapped result is processed
    # The last decode step's (key, rows) and the last rows placed on the mesh with their
    # metadata (rows, metadata): a decode step with the same requests in the same slots
    # reuses both.
    decode_rows: tuple | None = None
    placed_rows: tuple | None = None

    def end(self, reason: str) -> None:
        with _END_LOCK:
            if self.ended.done():
                return
            self.ended.set_result(reason)

    def fault(self, reason: str, error: BaseException | None = None) -> None:
        """An engine thread cannot go on: end the engine (never the process)."""
        if self.ended.done():
            return
        logger.error("the rollout engine stops: %s", reason, exc_info=error)
        self.error = error
        self.end(f"the engine stopped after a fault ({reason}); build a new one to go on")
        if self.on_fault is not None:
            self.on_fault(reason)


_active: EngineHooks | None = None


def activate(hooks: EngineHooks, wait_s: float) -> None:
    """Makes `hooks` the process's engine; a previous engine still shutting down after a
    fault gets `wait_s` to finish."""
    global _active
    previous = _active
    if previous is not None and previous.ended.done():
        previous.released.wait(wait_s)
    if _active is not None and not _active.stop.is_set():
        raise RuntimeError(
            "another sgl-jax rollout engine is running in this process; shut it down first"
        )
    _active = hooks


def deactivate(hooks: EngineHooks) -> None:
    global _active
    hooks.stop.set()
    hooks.end("the rollout engine was shut down")
    if _active is hooks:
        _active = None
    hooks.released.set()


def current() -> EngineHooks | None:
    return _active


def wrap(owner: Any, name: str, wrapper) -> None:
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def patched(*args, **kwargs):
        return wrapper(original, *args, **kwargs)

    setattr(patched, _MARK, True)
    setattr(owner, name, patched)


def wrap_classmethod(owner: type, name: str, wrapper) -> None:
    original = owner.__dict__[name].__func__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def patched(cls, *args, **kwargs):
        return wrapper(functools.partial(original, cls), *args, **kwargs)

    setattr(patched, _MARK, True)
    setattr(owner, name, classmethod(patched))


def requests_by_row(batch: Any) -> list[Any]:
    """The request at each row of the batch, None at padding rows. With dp > 1, rank r's
    requests start at row r * `per_dp_bs_size` (upstream `ScheduleBatch._merge_batch_metadata`;
    set by `get_model_worker_batch`)."""
    rows: list[Any] = []
    for rank, info in enumerate(batch.reqs_info):
        if rank:
            rows += [None] * (rank * batch.per_dp_bs_size - len(rows))
        rows += list(info.reqs or [])
    return rows


def batch_requests(batch: Any) -> list[Any]:
    return [req for req in requests_by_row(batch) if req is not None]


def fail_requests(scheduler: Any, reqs: list[Any], hooks: EngineHooks, stage: str, err) -> None:
    """Ends `reqs` with an abort whose message names the failure (upstream's own abort path:
    queues, chunked prefill, cache release); their callers get that message."""
    abort_req, finish_abort = upstream.get("AbortReq"), upstream.get("FINISH_ABORT")
    message = f"{stage} failed: {type(err).__name__}: {err}"
    logger.error(
        "%s; failing its %d request(s), the engine goes on", message, len(reqs), exc_info=err
    )
    hooks.collector.fail([req.rid for req in reqs], message)
    for req in reqs:
        if req.finished():
            continue
        scheduler.abort_request(abort_req(rid=req.rid))
        req.to_finish = finish_abort(message)
