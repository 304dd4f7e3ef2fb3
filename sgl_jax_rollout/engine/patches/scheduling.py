"""Scheduling fixes: no model step or host work upstream's scheduler spends for nothing
(catalog: `patches/__init__.py`).

Owns `install` for `whole_calls`, `finished_leave_first`, `no_step_after_the_last`,
`expert_ids_sync_when_captured`, `detokenizer_skips_our_text` and
`detokenizer_forgets_finished`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.patches.hooks import (
    current,
    logger,
    wrap,
)

# whole_calls: how long the scheduler waits for the rest of a call whose first requests arrived
# (they are sent microseconds apart; the call itself stops the wait when it fails).
CALL_ARRIVAL_WAIT_S = 1.0
# ... and for a call sent from another thread, none of whose requests has arrived yet (they take
# about a millisecond from the caller's thread to the scheduler; more while many threads call).
CALL_TRANSIT_WAIT_S = 0.02
CALL_POLL_S = 0.005  # how long one wait for them polls the scheduler's socket


def install() -> None:
    get = upstream.get
    wrap(get("Scheduler"), "recv_requests", _whole_calls)
    wrap(get("Scheduler"), "get_new_batch_prefill", _finished_leave_first)
    wrap(get("Scheduler"), "update_running_batch", _no_step_after_the_last)
    wrap(get("DetokenizerManager"), "handle_batch_token_id_out", _detokenize)
    wrap(get("ModelWorker"), "__init__", _expert_ids_sync_when_captured)


def _whole_calls(original, self, *args, **kwargs):
    """whole_calls: once part of a call's requests has arrived, receive until all of it has,
    and until calls already sent from other threads have arrived too (`arrivals.py`), so calls
    made together start as one batch."""
    received = original(self, *args, **kwargs)
    hooks = getattr(self, "_sgl_jax_rollout_hooks", None)
    if hooks is None:
        return received
    arrivals = hooks.arrivals
    arrivals.received(_rids(received))
    deadline = time.monotonic() + CALL_ARRIVAL_WAIT_S

    def waiting() -> bool:
        return arrivals.incomplete() or bool(received) and arrivals.in_transit(CALL_TRANSIT_WAIT_S)

    while waiting() and not hooks.stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            logger.warning(
                "part of a call's requests had not reached the scheduler after %.1f s; "
                "scheduling the ones that have",
                CALL_ARRIVAL_WAIT_S,
            )
            break
        if self.recv_from_tokenizer.poll(int(1e3 * min(left, CALL_POLL_S)) + 1):
            more = original(self, *args, **kwargs)
            arrivals.received(_rids(more))
            received = [*received, *more]
    return received


def _finished_leave_first(original, self, *args, **kwargs):
    """finished_leave_first: filter finished requests out of the running batch before
    admitting new ones, as upstream's `update_running_batch` does after (`scheduler.py:2365,
    2414-2420`), so they hold no slot of the new prefill."""
    running = self.running_batch
    if (
        getattr(self, "_sgl_jax_rollout_hooks", None) is not None
        and self.waiting_queue
        and any(req.finished() for info in running.reqs_info for req in info.reqs or ())
    ):
        before = [len(info.reqs or ()) for info in running.reqs_info]
        running.filter_batch()
        for info, size in zip(running.reqs_info, before, strict=True):
            if len(info.reqs or ()) < size:
                info.batch_is_full = False
    return original(self, *args, **kwargs)


def _no_step_after_the_last(original, self, batch, *args, **kwargs):
    """no_step_after_the_last: with overlap, requests whose token in flight is their last by
    length leave `batch` (the running batch) before upstream filters and builds the next
    decode step from it; they finish when that token is processed, as without overlap."""
    queued = getattr(self, "result_queue", None)  # set by upstream's overlap loop only
    if getattr(self, "_sgl_jax_rollout_hooks", None) is not None and queued:
        in_flight = {
            id(req)
            for launched, _ in queued
            for info in launched.reqs_info
            for req in info.reqs or ()
        }
        reqs = [info.reqs or [] for info in batch.reqs_info]
        keep = {
            rank: [
                i
                for i, req in enumerate(ranked)
                if id(req) not in in_flight or not _last_by_length(req)
            ]
            for rank, ranked in enumerate(reqs)
        }
        shrunk = [rank for rank, ranked in enumerate(reqs) if len(keep[rank]) < len(ranked)]
        if shrunk:
            batch.filter_batch(keep_indices=keep)
            for rank in shrunk:
                batch.reqs_info[rank].batch_is_full = False
    return original(self, batch, *args, **kwargs)


def _last_by_length(req) -> bool:
    """The request's next token, once processed, finishes it by length (upstream's
    `Req.check_finished`, `schedule_batch.py:582`)."""
    return not req.finished() and len(req.output_ids) + 1 >= req.sampling_params.max_new_tokens


def _rids(messages: Iterable[Any]) -> list[str]:
    return [rid for m in messages if isinstance(rid := getattr(m, "rid", None), str)]


def _expert_ids_sync_when_captured(original, self, *args, **kwargs):
    """expert_ids_sync_when_captured: the worker's `sync_queue` takes routed-expert ids only
    while the process's capturer records them (checked at each put: each model runner sets
    it when it starts)."""
    original(self, *args, **kwargs)
    self.sync_queue.put = functools.partial(_put_when_captured, self.sync_queue.put)


def _put_when_captured(put, item, *args, **kwargs) -> None:
    capturer = upstream.get("get_global_experts_capturer")()
    if not isinstance(capturer, upstream.get("RoutedExpertsCapturerNoop")):
        put(item, *args, **kwargs)


def _detokenize(original, self, recv_obj, *args, **kwargs):
    """detokenizer_skips_our_text, then detokenizer_forgets_finished: our requests' ids are cut
    to their last one before upstream decodes them; a finished request's decode state is
    dropped once its last text is made (upstream keeps it until 65,536 requests have passed)."""
    hooks = current()
    if hooks is not None:
        for i, ours in enumerate(hooks.collector.registered(recv_obj.rids)):
            if ours:
                recv_obj.decode_ids[i] = recv_obj.decode_ids[i][-1:]
    out = original(self, recv_obj, *args, **kwargs)
    for rid, reason in zip(recv_obj.rids, recv_obj.finished_reasons, strict=True):
        if reason is not None:
            self.decode_status.pop(rid, None)
    if hooks is not None:
        hooks.detokenizer_states = len(self.decode_status)
    return out
