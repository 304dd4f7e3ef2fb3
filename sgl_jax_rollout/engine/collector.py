"""Per-request stores shared by caller threads and the engine's scheduler thread.

Owns the only per-request state we add to the engine: the `RequestSpec` of each request we
submitted, the per-token values (logprob, entropy, top logprobs) recorded for it step by
step, and its `Completion` once finished. Callers `register` before submitting and `take`
(or `forget`) after; every store is keyed by request id, and `sizes()` lets tests check that
nothing outlives its request. Many calls may hold requests at once (`engine.call_gate`). A
call that needs only some groups of its requests `watch_groups`: a watch of its own, whose
future is set, on the scheduler thread, as soon as enough groups have every request finished;
with `accept`, only the groups `accept` passes count, judged on the caller's thread
(`judge_groups`) while the engine goes on.

The scheduler side is four hooks, called by the sampler hooks (`patches/sampler_hooks.py`):
`fail` (a step of these requests failed: each gets a completion carrying the error),
`stash_step` (the sampler's per-row values of the step just run, before the result is
processed), `record` (before sgl-jax streams outputs: new tokens are `len(req.output_ids)`
minus the values recorded, which covers the first token from prefill, chunked prefill and
retraction) and `end_step`. Tokens of a finished request are `output_ids_through_stop`, and
its values are cut to the same length: one value per returned token, stop token included.

No sgl_jax import: the hooks read only `rid`, `output_ids`, `output_ids_through_stop`,
`finished()`, `finished_reason`, `origin_input_ids` and `routed_experts` of the request
objects.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sgl_jax_rollout.engine.rows import RequestSpec


@dataclasses.dataclass
class StepValues:
    """Host copies of the sampler's per-row outputs for one step (rows in request order)."""

    logprobs: Sequence[float] | np.ndarray | None
    entropy: Sequence[float] | np.ndarray | None
    top_logprob_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None


@dataclasses.dataclass
class Completion:
    """One finished request: tokens and, aligned with them, the values asked for."""

    rid: str
    tokens: list[int]
    logprobs: list[float] | None
    entropy: list[float] | None
    top_logprob_ids: list[list[int]] | None
    top_logprobs: list[list[float]] | None
    finish_reason: Any
    error: str | None = None
    # With `EngineSettings.return_routed_experts`: the experts each MoE layer routed each
    # input position to, `[prompt + len(tokens) - 1, layers, top_k]` (the last token is never
    # an input), as upstream collects them when the request finishes.
    routed_experts: np.ndarray | None = None
    # The engine's weight version while the request ran (`RolloutEngine.weights_version`;
    # set by the call that took it: weights never change under a running call).
    weights_version: int | None = None


@dataclasses.dataclass
class _Record:
    logprobs: list[float] = dataclasses.field(default_factory=list)
    entropy: list[float] = dataclasses.field(default_factory=list)
    top_ids: list[list[int]] = dataclasses.field(default_factory=list)
    top_values: list[list[float]] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def count(self) -> int:
        return len(self.logprobs)


class Collector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, RequestSpec] = {}
        self._records: dict[str, _Record] = {}
        self._done: dict[str, Completion] = {}
        self._step_rows: dict[int, int] = {}
        self._step_values: StepValues | None = None
        self._watches: dict[str, _GroupWatch] = {}  # request id -> its call's group watch

    # Caller side.
    def watch_groups(
        self,
        group_of: Mapping[str, int],
        need: int,
        accept: Callable[[int, list[Completion]], bool] | None = None,
    ) -> _GroupWatch:
        """A watch of one call's requests: its `future` is set to the first `need` groups (ids,
        in the order they completed) whose every request finished without error or abort;
        `group_of` maps the call's request ids to groups. With `accept`, a complete group
        counts only when `accept(group, its completions in request order)` is true, called by
        `judge_groups` (the caller's thread). `unwatch` ends it."""
        watch = _GroupWatch(dict(group_of), need, accept)
        with self._lock:
            taken = [rid for rid in group_of if rid in self._watches]
            if taken:
                raise ValueError(f"request {taken[0]!r} is already watched by another call")
            self._watches.update(dict.fromkeys(group_of, watch))
        return watch

    def judge_groups(self, watch: _GroupWatch | None) -> list[int]:
        """With a watch's `accept`: judges the groups completed since the last call, in the
        order they completed (until the watch has `need`); returns every group accepted so
        far. The watching call's thread only."""
        if watch is None or watch.accept is None:
            return []
        while not watch.future.done():
            with self._lock:
                if not watch.ready:
                    break
                group = watch.ready.popleft()
                done = [self._done[rid] for rid in watch.rids_of[group]]
            if watch.accept(group, done):
                watch.accepted.append(group)
                if len(watch.accepted) == watch.need:
                    watch.future.set_result(list(watch.accepted))
        return list(watch.accepted)

    def unwatch(self, watch: _GroupWatch | None) -> None:
        if watch is None:
            return
        with self._lock:
            for rid in watch.group_of:
                if self._watches.get(rid) is watch:
                    del self._watches[rid]

    def register(self, rid: str, spec: RequestSpec) -> None:
        with self._lock:
            if rid in self._specs or rid in self._done:
                raise ValueError(f"request id {rid!r} is already in use")
            self._specs[rid] = spec
            self._records[rid] = _Record()

    def take(self, rid: str) -> Completion | None:
        """Pops the completion of a finished request (None if none was recorded: the request
        ended before its first step, e.g. aborted while queued)."""
        with self._lock:
            self._specs.pop(rid, None)
            self._records.pop(rid, None)
            return self._done.pop(rid, None)

    def forget(self, rids: Iterable[str]) -> None:
        """Drops everything held for `rids` (aborted or failed requests)."""
        with self._lock:
            for rid in rids:
                self._specs.pop(rid, None)
                self._records.pop(rid, None)
                self._done.pop(rid, None)

    def fail(self, rids: Iterable[str], message: str) -> None:
        """Scheduler side, a step failed: each of `rids` we hold ends with `message` as its
        error (its caller raises it); nothing more is recorded for it."""
        with self._lock:
            for rid in rids:
                if rid not in self._records:
                    continue  # not ours (scoring, warm-up) or already finished
                self._done[rid] = Completion(
                    rid=rid,
                    tokens=[],
                    logprobs=None,
                    entropy=None,
                    top_logprob_ids=None,
                    top_logprobs=None,
                    finish_reason={"type": "abort", "message": message},
                    error=message,
                )
                del self._records[rid]
                self._specs.pop(rid, None)

    def sizes(self) -> dict[str, int]:
        """Entries held per request. (The per-step stash is cleared at the end of each step,
        which may come a moment after the step's outputs reached the caller.)"""
        with self._lock:
            return {
                "specs": len(self._specs),
                "records": len(self._records),
                "completions": len(self._done),
                "watches": len(self._watches),
            }

    # Scheduler side.
    def registered(self, rids: Iterable[str]) -> list[bool]:
        """Which of `rids` are requests we submitted and still hold (running, or finished and
        not yet taken)."""
        with self._lock:
            return [rid in self._specs or rid in self._done for rid in rids]

    def finished(self, rid: str) -> bool:
        """Whether request `rid` has finished (its completion waits to be taken)."""
        with self._lock:
            return rid in self._done

    def spec_for(self, rid: str) -> RequestSpec | None:
        with self._lock:
            return self._specs.get(rid)

    def stash_step(self, reqs: Sequence[Any], values: StepValues) -> None:
        with self._lock:
            self._step_rows = {id(req): row for row, req in enumerate(reqs)}
            self._step_values = values

    def end_step(self) -> None:
        with self._lock:
            self._step_rows = {}
            self._step_values = None

    def record(self, reqs: Iterable[Any]) -> None:
        with self._lock:
            for req in reqs:
                rec = self._records.get(req.rid)
                if rec is None:
                    continue
                self._append_new(req, rec)
                if req.finished():
                    self._finish(req, rec)

    def _append_new(self, req: Any, rec: _Record) -> None:
        new = len(req.output_ids) - rec.count
        if new == 0 or rec.error:
            return
        row = self._step_rows.get(id(req))
        values = self._step_values
        if new != 1 or row is None or values is None:
            rec.error = (
                f"request {req.rid}: {new} new token(s) at one step without sampler values "
                f"(recorded {rec.count}, output has {len(req.output_ids)})"
            )
            return
        rec.logprobs.append(float(values.logprobs[row]) if values.logprobs is not None else 0.0)
        rec.entropy.append(float(values.entropy[row]) if values.entropy is not None else 0.0)
        if values.top_logprob_ids is not None:
            rec.top_ids.append(values.top_logprob_ids[row].tolist())
            rec.top_values.append(values.top_logprobs[row].tolist())

    def _finish(self, req: Any, rec: _Record) -> None:
        tokens = list(req.output_ids_through_stop)
        n = len(tokens)
        spec = self._specs.get(req.rid)
        error = rec.error
        if error is None and rec.count < n:
            error = f"request {req.rid}: {n} tokens but only {rec.count} sampler values"
        want_lp = spec is None or spec.options.return_logprobs
        want_ent = spec is None or spec.options.return_entropy
        self._done[req.rid] = Completion(
            rid=req.rid,
            tokens=tokens,
            logprobs=rec.logprobs[:n] if want_lp else None,
            entropy=rec.entropy[:n] if want_ent else None,
            top_logprob_ids=rec.top_ids[:n] if rec.top_ids else None,
            top_logprobs=rec.top_values[:n] if rec.top_values else None,
            finish_reason=_finish_reason(req),
            error=error,
            routed_experts=_routed_experts(req, n),
        )
        self._records.pop(req.rid, None)
        self._specs.pop(req.rid, None)
        watch = self._watches.get(req.rid)
        if watch is not None:
            reason = self._done[req.rid].finish_reason
            aborted = isinstance(reason, dict) and reason.get("type") == "abort"
            watch.finished(req.rid, error is None and not aborted)


class _GroupWatch:
    """Which groups of a call have every request finished (`Collector.watch_groups`)."""

    def __init__(self, group_of: dict[str, int], need: int, accept: Any = None) -> None:
        self.group_of = group_of
        self.left: dict[int, int] = {}
        self.rids_of: dict[int, list[str]] = collections.defaultdict(list)
        for rid, group in group_of.items():
            self.left[group] = self.left.get(group, 0) + 1
            self.rids_of[group].append(rid)
        self.need = need
        self.complete: list[int] = []
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.accept = accept  # judged by `Collector.judge_groups`, on the caller's thread
        self.ready: collections.deque[int] = collections.deque()  # complete, not judged yet
        self.accepted: list[int] = []

    def finished(self, rid: str, ok: bool) -> None:
        group = self.group_of.get(rid)
        if group is None or self.future.done() or self.left[group] < 0:
            return
        self.left[group] = self.left[group] - 1 if ok else -1  # -1: the group cannot complete
        if self.left[group] == 0:
            self.complete.append(group)
            if self.accept is not None:
                self.ready.append(group)
            elif len(self.complete) == self.need:
                self.future.set_result(list(self.complete))


def _routed_experts(req: Any, tokens: int) -> np.ndarray | None:
    """Upstream's routed experts of a finished request (`Req.routed_experts`, `[seqlen - 1,
    layers, top_k]`, set before the output is streamed: `maybe_collect_routed_experts`), cut
    to the input positions of the tokens returned."""
    routed = getattr(req, "routed_experts", None)
    if routed is None:
        return None
    return np.asarray(routed, np.int32)[: len(req.origin_input_ids) + tokens - 1]


def _finish_reason(req: Any) -> Any:
    reason = req.finished_reason
    return reason.to_json() if hasattr(reason, "to_json") else reason
