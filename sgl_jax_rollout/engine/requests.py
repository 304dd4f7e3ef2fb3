"""Requests of the running engine: generation, scoring and aborts.

Owns `Requests`, behind `RolloutEngine.generate`, `score` and `abort`: token ids checked
against the vocabulary, one batch request per call sent to sgl-jax's tokenizer manager on the
engine's own event loop (so any thread may call), early stop of `generate` by groups (with
`accept`, slime's dynamic sampling), the shared prefill of repeated prompts, and every failure
named in one RuntimeError. Also `PrefillCounts` and `reported_input_id`.

Calls from many threads run at once: each is admitted by the engine's `CallGate` as a serving
call of its sampler output mode, and its requests join the engine's running batch beside
other calls' (continuous batching across calls). What a call needs beyond the collector's
stores, which are keyed by request id, is its own: its request ids and group watch are the
call's locals, why it was aborted its `_CallState` (which `abort` reaches), with the cancel of
the calling thread's `cancel_scope`, which ends the call's requests like an early stop. Must not
change weights or memory (it only asks `check_serving`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED
from typing import Any

import numpy as np

from sgl_jax_rollout.engine import cancel_scope, upstream
from sgl_jax_rollout.engine.call_gate import SCORING_MODE, CallGate
from sgl_jax_rollout.engine.collector import Collector, Completion
from sgl_jax_rollout.engine.process import EngineProcess
from sgl_jax_rollout.engine.request_checks import checked_groups, checked_ids
from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.engine.settings import EngineSettings

logger = logging.getLogger(__name__)

JUDGE_POLL_S = 0.01  # how often a call with `accept` judges the groups that finished
ABORT_RESEND_S = 0.05  # how often an early stop or a cancel sends its aborts again


@dataclasses.dataclass
class PrefillCounts:
    """Prefill work of `generate` calls over the engine's life: `sent`, the prompt tokens of
    their requests; `computed`, the prefill tokens the engine computed for them (upstream's
    per-request `prompt_tokens - cached_tokens`, shared group prefills included)."""

    sent: int = 0
    computed: int = 0

    def add(self, outputs: Sequence[dict], sent: int) -> None:
        self.sent += sent
        for out in outputs:
            meta = out["meta_info"]
            self.computed += int(meta.get("prompt_tokens", 0)) - int(meta.get("cached_tokens", 0))


@dataclasses.dataclass(eq=False)
class _CallState:
    """What one running call owns: `abort_reason`, set when `RolloutEngine.abort` or its
    `cancel_scope` ended it, and that scope's `cancel` future."""

    abort_reason: str | None = None
    cancel: concurrent.futures.Future | None = None


class Requests:
    def __init__(
        self,
        process: EngineProcess,
        gate: CallGate,
        check_serving: Callable[[str], None],
        weights_version: Callable[[], int],
        collector: Collector,
        prefill_counts: PrefillCounts,
        vocab_size: int,
    ) -> None:
        self._process = process
        self._gate = gate  # the engine's admission
        self._check_serving = check_serving  # `MemoryLifecycle.check_serving`
        self._weights_version = weights_version  # fixed while any call is admitted
        self.collector = collector
        self.prefill_counts = prefill_counts
        self.vocab_size = vocab_size
        self._calls_lock = threading.Lock()
        self._calls: set[_CallState] = set()  # the calls running now (`abort` ends them)
        self._count_lock = threading.Lock()  # `prefill_counts` is added to by every call

    def generate(
        self,
        settings: EngineSettings,
        prompts: Sequence[Sequence[int]],
        specs: Sequence[RequestSpec],
        max_new_tokens: int | Sequence[int],
        stop: Sequence[Sequence[str]] | None,
        stop_token_ids: Sequence[Sequence[int]] | None,
        ignore_eos: Sequence[bool] | None,
        groups: Sequence[int] | None,
        need_groups: int | None,
        keep_partial: bool,
        accept: Callable[[int, list[Completion]], bool] | None,
    ) -> list[Completion | None]:
        """`RolloutEngine.generate` (which owns the defaults), under the engine's `settings`
        of the moment."""
        if len(prompts) != len(specs):
            raise ValueError(f"{len(prompts)} prompts but {len(specs)} sampling specs")
        if not prompts:
            return []
        modes = {s.mode() for s in specs}
        if len(modes) > 1:
            raise ValueError(f"one call must use one logprob / entropy mode, got {modes}")
        rows = len(prompts)
        checked_groups(groups, need_groups, rows)
        if accept is not None and need_groups is None:
            raise ValueError("accept judges groups: it needs groups and need_groups")
        input_ids = [checked_ids(p, self.vocab_size, f"prompt {i}") for i, p in enumerate(prompts)]
        stop = stop or [()] * rows
        stop_token_ids = stop_token_ids or [()] * rows
        ignore_eos = ignore_eos or [False] * rows
        limits = [max_new_tokens] * rows if isinstance(max_new_tokens, int) else max_new_tokens
        if len(limits) != rows:
            raise ValueError(f"max_new_tokens has {len(limits)} entries for {rows} prompts")
        params = [
            {
                "max_new_tokens": limits[i],
                "stop": list(stop[i]) or None,
                "stop_token_ids": list(stop_token_ids[i]) or None,
                "ignore_eos": bool(ignore_eos[i]),
            }
            for i in range(rows)
        ]
        rids = [uuid.uuid4().hex for _ in range(rows)]
        with self._gate.serving(modes.pop()), self._running() as call:
            self._check_serving("generate")
            version = self._weights_version()
            watch = None
            try:
                self._share_prefill(settings, input_ids, call)
                for rid, spec in zip(rids, specs, strict=True):
                    self.collector.register(rid, spec)
                if need_groups is not None:
                    group_of = dict(zip(rids, groups, strict=True))
                    watch = self.collector.watch_groups(group_of, need_groups, accept)
                outputs = self._submit(
                    watch,
                    call,
                    input_ids=input_ids,
                    sampling_params=params,
                    rid=rids,
                    return_routed_experts=settings.return_routed_experts,
                )
                accepted = self.collector.judge_groups(watch)  # the groups that finished last
                completions = [self.collector.take(rid) for rid in rids]
                for done in completions:
                    if done is not None:
                        done.weights_version = version
            except BaseException:
                self._abort(rids)
                raise
            finally:
                self.collector.unwatch(watch)
                self.collector.forget(rids)
        self._count(outputs, sum(map(len, input_ids)))
        keep = [True] * rows
        if accept is not None:
            passed = set(accepted)
            keep = [g in passed for g in groups]
        elif watch is not None:
            kept = set(watch.future.result() if watch.future.done() else watch.complete)
            keep = [g in kept for g in groups]
        failures = [
            problem
            for out, done, k in zip(outputs, completions, keep, strict=True)
            if (problem := self._failure(out, done, call) if k else done and done.error) is not None
        ]
        if failures:
            raise RuntimeError(_summary(failures, rows))
        if keep_partial:
            return [c or _unstarted(rid, version) for c, rid in zip(completions, rids, strict=True)]
        return [c if k else None for c, k in zip(completions, keep, strict=True)]

    @contextlib.contextmanager
    def _running(self) -> Iterator[_CallState]:
        """The state of a call admitted to the engine, known to `abort` while it runs."""
        scope = cancel_scope.current()
        if scope is not None:
            scope.check()
        call = _CallState(cancel=None if scope is None else scope.future)
        with self._calls_lock:
            self._calls.add(call)
        try:
            yield call
        finally:
            with self._calls_lock:
                self._calls.discard(call)

    def _count(self, outputs: Sequence[dict], sent: int) -> None:
        with self._count_lock:
            self.prefill_counts.add(outputs, sent)

    def _share_prefill(
        self, settings: EngineSettings, input_ids: list[list[int]], call: _CallState
    ) -> None:
        """share_group_prefill: every prompt the call holds more than once is prefilled once,
        in a prefill-only request of its own (`max_new_tokens` 0, as upstream's tokenizer
        manager does for `parallel_sample_num`), so that its copies find its KV in the prefix
        cache and compute only their last prompt token.

        They go at most `max_running_requests` (per data-parallel rank) at a time: upstream
        never merges a prefill-only batch into its running batch (`get_next_batch_to_run`,
        `scheduler.py:1997`), so with the overlap schedule the request slots of one in flight
        are not counted when the next prefill batch is admitted, and `alloc_req_slots` runs
        out of slots (sgl-jax cddbf6f1)."""
        if not settings.share_group_prefill or settings.disable_radix_cache:
            return
        counts = collections.Counter(map(tuple, input_ids))
        repeated = [list(ids) for ids, count in counts.items() if count > 1]
        per_submit = max(1, settings.max_running_requests // settings.dp_size)
        for start in range(0, len(repeated), per_submit):
            part = repeated[start : start + per_submit]
            outputs = self._submit_unrecorded(
                "shared prompt prefills",
                call,
                input_ids=part,
                sampling_params=[{"max_new_tokens": 0}] * len(part),
                rid=[uuid.uuid4().hex for _ in part],
            )
            self._count(outputs, 0)

    def _submit_unrecorded(self, what: str, call: _CallState, **fields: Any) -> list[dict]:
        """`_submit` for requests the collector does not record (scoring, shared prefills):
        aborted when the submission fails; RuntimeError naming `what` if any was aborted."""
        try:
            outputs = self._submit(None, call, **fields)
        except BaseException:
            self._abort(fields["rid"])
            raise
        failures = [p for out in outputs if (p := self._aborted(out, call)) is not None]
        if failures:
            raise RuntimeError(_summary(failures, len(outputs), what))
        return outputs

    def score(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """`RolloutEngine.score`."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        rows = [i for i, c in enumerate(completions) if len(c)]
        result = [np.zeros((0,), np.float32) for _ in completions]
        if not rows:
            return result
        ids = {}
        for i in rows:
            if not len(prompts[i]):
                raise ValueError(f"prompt {i} is empty: scoring needs at least one prompt token")
            prompt = checked_ids(prompts[i], self.vocab_size, f"prompt {i}")
            ids[i] = (prompt, checked_ids(completions[i], self.vocab_size, f"completion {i}"))
        with self._gate.serving(SCORING_MODE), self._running() as call:
            self._check_serving("score")
            outputs = self._submit_unrecorded(
                "scoring",
                call,
                input_ids=[ids[i][0] + ids[i][1] for i in rows],
                sampling_params=[{"max_new_tokens": 1, "temperature": 0.0}] * len(rows),
                rid=[uuid.uuid4().hex for _ in rows],
                return_logprob=[True] * len(rows),
                logprob_start_len=[len(ids[i][0]) - 1 for i in rows],
            )
        for i, out in zip(rows, outputs, strict=True):
            entries = out["meta_info"]["input_token_logprobs"][1:]
            scored = [e[1] for e in entries]
            if scored != [reported_input_id(t, self.vocab_size) for t in ids[i][1]]:
                raise RuntimeError(f"scoring row {i}: the engine scored other tokens than given")
            result[i] = np.asarray([e[0] for e in entries], np.float32)
        return result

    def abort(self, reason: str) -> None:
        """`RolloutEngine.abort`: every call running now ends, naming `reason`."""
        if self._process.engine is None or self._process.hooks.ended.done():
            return
        with self._calls_lock:
            for call in self._calls:
                call.abort_reason = reason
        self._process.abort_requests()

    def _failure(self, out: dict, done: Completion | None, call: _CallState) -> str | None:
        """Why a request's completion cannot be returned, or None."""
        if done is not None and done.error:
            return done.error
        aborted = self._aborted(out, call)
        if aborted is not None:
            return aborted
        expected = out["meta_info"]["completion_tokens"]
        if done is None or len(done.tokens) != expected:
            recorded = "no" if done is None else len(done.tokens)
            return (
                f"engine output for request {out['meta_info']['id']} is inconsistent "
                f"({recorded} tokens recorded, engine reports {expected})"
            )
        return None

    def _aborted(self, out: dict, call: _CallState) -> str | None:
        reason = out["meta_info"].get("finish_reason")
        if not isinstance(reason, dict) or reason.get("type") != "abort":
            return None
        message = reason.get("message") or "aborted"
        if call.abort_reason is not None and message in ("Aborted", "Abort before prefill"):
            return f"aborted: {call.abort_reason}"
        return message

    def _submit(self, watch: Any, call: _CallState, **fields: Any) -> list[dict]:
        """Sends one batch request; returns its outputs, or raises when the engine ends first
        (shut down from another thread, or stopped by a fault). When the future of `watch` (a
        `Collector.watch_groups` watch, or None) or the call's cancel is set first, every
        request of the batch still running is aborted and the outputs come back once upstream
        has ended them. With the watch's `accept`, its groups are judged here as they finish
        (`Collector.judge_groups`), every `JUDGE_POLL_S`."""
        obj = upstream.get("GenerateReqInput")(**fields)
        engine, hooks = self._process.engine, self._process.hooks

        async def run():
            return await engine.tokenizer_manager.generate_request(obj, None).__anext__()

        # The scheduler starts the call's requests together (patches/scheduling.py, whole_calls).
        hooks.arrivals.expect(fields["rid"])
        future = asyncio.run_coroutine_threadsafe(run(), engine.loop)
        early = None if watch is None else watch.future
        ends = [f for f in (early, call.cancel) if f is not None]
        try:
            poll = JUDGE_POLL_S if watch is not None and watch.accept is not None else None
            waits = [future, hooks.ended, *ends]
            while not concurrent.futures.wait(waits, poll, FIRST_COMPLETED).done:
                self.collector.judge_groups(watch)
            if call.cancel is not None and call.cancel.done():
                call.abort_reason = call.cancel.result()
            while any(f.done() for f in ends) and not future.done() and not hooks.ended.done():
                # again every ABORT_RESEND_S: upstream drops an abort that reaches it before
                # its request does (`TokenizerManager.abort_request`)
                self._abort([rid for rid in fields["rid"] if not self.collector.finished(rid)])
                concurrent.futures.wait([future, hooks.ended], ABORT_RESEND_S, FIRST_COMPLETED)
            if not future.done():
                raise RuntimeError(f"{hooks.ended.result()}; this call did not finish")
            out = future.result()
        except BaseException:
            future.cancel()
            raise
        finally:
            hooks.arrivals.forget(fields["rid"])
        return out if isinstance(out, list) else [out]

    def _abort(self, rids: Sequence[str]) -> None:
        if self._process.engine is None or self._process.hooks.ended.done():
            return
        try:
            self._process.abort_requests(rids)
        except Exception:  # a shutdown may have begun since; else the requests run on
            if not self._process.hooks.ended.done():
                logger.warning("the abort of %d request(s) failed", len(rids), exc_info=True)


def reported_input_id(token: int, vocab_size: int) -> int:
    """The id sgl-jax reports beside the logprob of a scored input token.

    `SchedulerOutputProcessorMixin.add_input_logprob_return_values`
    (`scheduler_output_processor_mixin.py:668`, commit in `availability.PINNED_COMMIT`) rewrites
    every id `>= vocab_size - 1` to 0 (meant to clip image-token hashes, off by one, so the last
    real id is caught too). Only the reported id: the logprob is gathered on device at the real
    id (`ScheduleBatch` fills `extend_input_logprob_token_ids` from `origin_input_ids`,
    `schedule_batch.py:1277`), so the value is right and the check must expect the rewrite.
    """
    return token if token < vocab_size - 1 else 0


def _unstarted(rid: str, version: int) -> Completion:
    """The completion of a request aborted before it started: no tokens."""
    reason = {"type": "abort", "message": "not started"}
    return Completion(rid, [], [], [], None, None, reason, weights_version=version)


def _summary(failures: Sequence[str], total: int, what: str = "requests") -> str:
    distinct = list(dict.fromkeys(failures))
    shown = "; ".join(distinct[:3]) + ("; ..." if len(distinct) > 3 else "")
    return f"{len(failures)} of {total} {what} failed: {shown}"
