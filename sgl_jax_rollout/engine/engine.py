"""The in-process sgl-jax engine with our sampler inside, as the rollout uses it.

Owns `RolloutEngine`: start sgl-jax in single-process mode from a model directory and
`EngineSettings`, then `generate` (token ids in, `Completion`s out: tokens with one logprob
and one entropy each), `score` (prefill-only logprobs of given completions), `update_weights`
(checked, atomic, serialised with generation, prefix cache flushed) and `shutdown` (stops the
engine's own threads; never signals other processes, unlike upstream's `Engine.shutdown`).

Calls are serialised by one lock: a batch never mixes requests of two calls, and a weight
swap never races a running step. Requests go to sgl-jax's tokenizer manager on the engine's
own event loop (`enable_engine_loop_run_forever_daemon`), so any thread may call.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import signal
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from sgl_jax_rollout.engine import memory, patches, upstream
from sgl_jax_rollout.engine.availability import require_sgl_jax
from sgl_jax_rollout.engine.collector import Collector, Completion
from sgl_jax_rollout.engine.lora import LoraLayout, engine_lora_args
from sgl_jax_rollout.engine.rope_scaling import check_rope_scaling
from sgl_jax_rollout.engine.rows import RequestSpec, extra_sampler_configs
from sgl_jax_rollout.engine.settings import (
    EXPERT_COUNT_KEYS,
    EngineSettings,
    language_config,
    window_kv_differs,
)
from sgl_jax_rollout.utils import compilation_cache
from sgl_jax_rollout.utils.compiles import ENGINE_START_EVENT
from sgl_jax_rollout.utils.model_dir import load_tokenizer, missing_key, read_config

logger = logging.getLogger(__name__)

SCHEDULER_THREAD_PREFIX = "sglang::scheduler"
DETOKENIZER_THREAD_PREFIX = "sglang-jax::detokenizer"
STOP_TIMEOUT_S = 30.0
JUDGE_POLL_S = 0.01  # how often a call with `accept` judges the groups that finished
TOKENIZER_WORKAROUND = "Created patched tokenizer config workaround"  # sgl-jax's warning


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


class RolloutEngine:
    def __init__(
        self,
        model_path: str | Path,
        settings: EngineSettings | None = None,
        sampler_modes: Sequence[dict[str, Any]] = (),
        lora: LoraLayout | None = None,
    ) -> None:
        """Starts the engine; on any failure, whatever was started is stopped again (threads,
        sockets, signal handlers, the process's engine slot) before the error propagates.

        The sampler is compiled at start for its default mode, for `sampler_modes` (dicts as
        in `EngineSettings.sampler_modes`, which are added) and for every batch bucket. With
        `lora`, the engine serves LoRA adapters unmerged on sgl-jax's static LoRA path
        (`engine.lora`); they start at zero until `update_weights` brings them."""
        settings = settings or EngineSettings()
        model_path = Path(model_path)
        model_config = read_config(model_path)
        check_rope_scaling(model_config)
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "build the rollout engine on the main thread: sgl-jax installs signal "
                "handlers while it starts, which Python allows only there"
            )
        require_sgl_jax()
        import jax

        if (
            jax.default_backend() == "cpu"
            and settings.page_size != 1
            and settings.native_attention == "upstream"
        ):
            raise ValueError(
                f"page_size must be 1 with native_attention='upstream' on CPU, got "
                f"{settings.page_size}: sgl-jax's own CPU attention reads a larger page's slots "
                "at the wrong offsets (wrong logits for every request but the first of a "
                "batch); native_attention='paged' serves every page size"
            )
        experts = language_config(model_config)
        if settings.return_routed_experts and not any(map(experts.get, EXPERT_COUNT_KEYS)):
            raise ValueError(
                "return_routed_experts needs a mixture-of-experts model: config.json has none of "
                f"{list(EXPERT_COUNT_KEYS)} (this model is dense)"
            )
        cache_root = compilation_cache.cache_root(settings.compilation_cache_dir)
        settings = _on_devices(settings, jax.devices())
        self.model_path = model_path
        self.model_type = model_config.get("model_type", "")
        self.settings = settings
        self.tokenizer = load_tokenizer(model_path)
        try:
            vocab = int(language_config(model_config)["vocab_size"])
        except KeyError as err:
            raise missing_key(model_path, model_config, err) from None
        self.vocab_size = vocab
        valid = len(self.tokenizer) if len(self.tokenizer) < vocab else None
        self.collector = Collector()
        self.prefill_counts = PrefillCounts()
        self._hooks = patches.EngineHooks(
            collector=self.collector,
            valid_vocab_size=valid,
            sampler_configs=extra_sampler_configs([*settings.sampler_modes, *sampler_modes], valid),
            vocab_parallel=_vocab_parallel(settings, vocab),
            native_attention=settings.native_attention,
        )
        self._lock = threading.Lock()  # one call at a time
        self._ending = threading.Lock()  # one shutdown at a time
        self._abort_reason: str | None = None
        self._engine = None
        self._scheduler = None
        self.model_runner = None
        self._weights = None
        self._released: memory.Released | None = None  # set between release and resume
        self._resume_on_use = False  # the next call that needs the engine resumes it
        self._restore = None  # with resume_on_use: the weights a serving call resumes with
        self._weights_pending = False  # resumed without weights: update_weights comes first

        server_args = settings.server_args(
            str(model_path), jax.default_backend(), window_kv_differs(model_config)
        )
        if lora is not None:
            server_args.update(engine_lora_args(lora, self.model_type))
        self.lora = lora  # the static LoRA layout served (None: no adapters)
        if cache_root is not None:
            compilation_cache.enable_compilation_cache(cache_root)
        patches.apply(server_args)
        patches.activate(self._hooks, STOP_TIMEOUT_S)
        atexit.register(self.shutdown)
        started = time.perf_counter()
        try:
            self._start(server_args)
        except BaseException as err:
            reason = self._hooks.ended.result() if self._hooks.ended.done() else None
            self._teardown("the engine failed to start")
            if reason is not None:
                raise RuntimeError(f"the sgl-jax engine failed to start: {reason}") from (
                    self._hooks.error or err
                )
            raise
        self._hooks.on_fault = self._shut_down_after_fault
        start_seconds = time.perf_counter() - started
        jax.monitoring.record_event_duration_secs(ENGINE_START_EVENT, start_seconds)
        logger.info("sgl-jax engine ready in %.1fs: %s, %s", start_seconds, model_path, settings)

    def _start(self, server_args: dict[str, Any]) -> None:
        from sgl_jax_rollout.engine.weights import WeightSwapper

        engine_class = upstream.get("Engine")
        # sgl-jax's tokenizer, scheduler and detokenizer each load the tokenizer through a
        # patched copy of its config (for the installed transformers) and warn each time, with
        # a new temporary path: noise a user cannot act on, said once at debug level instead.
        warnings.filterwarnings("ignore", message=TOKENIZER_WORKAROUND, category=UserWarning)
        logger.debug("sgl-jax loads the tokenizer through a patched config (its warning hidden)")

        # Built in two steps so that a failing __init__ still leaves the object to clean up.
        engine = engine_class.__new__(engine_class)
        self._engine = engine
        with _signal_handlers_kept():
            try:
                engine.__init__(**server_args)
            finally:
                # Upstream registers Engine.shutdown, which SIGKILLs every child process.
                atexit.unregister(engine.shutdown)
        if self._hooks.ended.done():  # a thread failed while the engine started
            raise RuntimeError(self._hooks.ended.result())
        self._scheduler = upstream.scheduler_of(engine)
        self.model_runner = upstream.model_runner_of(self._scheduler)
        self._weights = WeightSwapper(self.model_runner, self.model_type, self.lora)

    # Generation.
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        specs: Sequence[RequestSpec],
        max_new_tokens: int | Sequence[int],
        stop: Sequence[Sequence[str]] | None = None,
        stop_token_ids: Sequence[Sequence[int]] | None = None,
        ignore_eos: Sequence[bool] | None = None,
        groups: Sequence[int] | None = None,
        need_groups: int | None = None,
        keep_partial: bool = False,
        accept: Callable[[int, list[Completion]], bool] | None = None,
    ) -> list[Completion | None]:
        """One completion per (prompt, spec), in order. Specs must share their output modes.
        `max_new_tokens`: one limit for every row, or one per row.

        With `groups` (a group id per row) and `need_groups`, the call returns as soon as that
        many groups have every row finished: the rows of the other groups are aborted (their KV
        freed) and come back as None, or with `keep_partial` as what they had sampled (a
        `Completion` whose `finish_reason` is an abort unless the row had finished; no tokens
        for a row that never started). With `accept` (slime's dynamic sampling), a finished
        group counts only when `accept(group, its completions)` is true; it is called on this
        thread, in the order groups finish, while the engine goes on; a group it refuses comes
        back as None (or as sampled, with `keep_partial`). Without enough accepted groups the
        call returns when every row has finished.

        Raises RuntimeError naming the failure when any request of the call failed (a step
        of the engine raised, the call was aborted, the engine stopped); the engine keeps
        serving unless it stopped.
        """
        if len(prompts) != len(specs):
            raise ValueError(f"{len(prompts)} prompts but {len(specs)} sampling specs")
        if not prompts:
            return []
        modes = {s.mode() for s in specs}
        if len(modes) > 1:
            raise ValueError(f"one call must use one logprob / entropy mode, got {modes}")
        rows = len(prompts)
        _check_groups(groups, need_groups, rows)
        if accept is not None and need_groups is None:
            raise ValueError("accept judges groups: it needs groups and need_groups")
        input_ids = [self._checked_ids(p, f"prompt {i}") for i, p in enumerate(prompts)]
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
        with self._lock:
            self._check_serving("generate")
            self._abort_reason = None
            try:
                self._share_prefill(input_ids)
                for rid, spec in zip(rids, specs, strict=True):
                    self.collector.register(rid, spec)
                early = None
                if need_groups is not None:
                    group_of = dict(zip(rids, groups, strict=True))
                    early = self.collector.watch_groups(group_of, need_groups, accept)
                outputs = self._submit(
                    early=early,
                    judged=accept is not None,
                    input_ids=input_ids,
                    sampling_params=params,
                    rid=rids,
                    return_routed_experts=self.settings.return_routed_experts,
                )
                accepted = self.collector.judge_groups()  # the groups that finished last
                completions = [self.collector.take(rid) for rid in rids]
            except BaseException:
                self._abort(rids)
                raise
            finally:
                self.collector.unwatch()
                self.collector.forget(rids)
        self.prefill_counts.add(outputs, sum(map(len, input_ids)))
        keep = [True] * rows
        if accept is not None:
            passed = set(accepted)
            keep = [g in passed for g in groups]
        elif early is not None:
            kept = set(early.result())
            keep = [g in kept for g in groups]
        failures = [
            problem
            for out, done, k in zip(outputs, completions, keep, strict=True)
            if (problem := self._failure(out, done) if k else done and done.error) is not None
        ]
        if failures:
            raise RuntimeError(_summary(failures, rows))
        if keep_partial:
            return [c or _unstarted(rid) for c, rid in zip(completions, rids, strict=True)]
        return [c if k else None for c, k in zip(completions, keep, strict=True)]

    def _share_prefill(self, input_ids: list[list[int]]) -> None:
        """share_group_prefill: every prompt the call holds more than once is prefilled once,
        in a prefill-only request of its own (`max_new_tokens` 0, as upstream's tokenizer
        manager does for `parallel_sample_num`), so that its copies find its KV in the prefix
        cache and compute only their last prompt token.

        They go at most `max_running_requests` (per data-parallel rank) at a time: upstream
        never merges a prefill-only batch into its running batch (`get_next_batch_to_run`,
        `scheduler.py:1997`), so with the overlap schedule the request slots of one in flight
        are not counted when the next prefill batch is admitted, and `alloc_req_slots` runs
        out of slots (sgl-jax cddbf6f1)."""
        if not self.settings.share_group_prefill or self.settings.disable_radix_cache:
            return
        counts = collections.Counter(map(tuple, input_ids))
        repeated = [list(ids) for ids, count in counts.items() if count > 1]
        per_submit = max(1, self.settings.max_running_requests // self.settings.dp_size)
        for start in range(0, len(repeated), per_submit):
            part = repeated[start : start + per_submit]
            outputs = self._submit_unrecorded(
                "shared prompt prefills",
                input_ids=part,
                sampling_params=[{"max_new_tokens": 0}] * len(part),
                rid=[uuid.uuid4().hex for _ in part],
            )
            self.prefill_counts.add(outputs, 0)

    def _submit_unrecorded(self, what: str, **fields: Any) -> list[dict]:
        """`_submit` for requests the collector does not record (scoring, shared prefills):
        aborted when the submission fails; RuntimeError naming `what` if any was aborted."""
        try:
            outputs = self._submit(**fields)
        except BaseException:
            self._abort(fields["rid"])
            raise
        failures = [p for out in outputs if (p := self._aborted(out)) is not None]
        if failures:
            raise RuntimeError(_summary(failures, len(outputs), what))
        return outputs

    def score(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Logprob of each completion token given the prompt and the tokens before it.

        One prefill per row under the current weights (raw `log_softmax` of the logits), no
        sampling kept. Rows with an empty completion give an empty array.
        """
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
            prompt = self._checked_ids(prompts[i], f"prompt {i}")
            ids[i] = (prompt, self._checked_ids(completions[i], f"completion {i}"))
        with self._lock:
            self._check_serving("score")
            self._abort_reason = None
            outputs = self._submit_unrecorded(
                "scoring",
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

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Ends every request in flight; the running call raises RuntimeError with `reason`.
        The engine keeps serving (safe from any thread)."""
        engine = self._engine
        if engine is None or self._hooks.ended.done():
            return
        self._abort_reason = reason
        engine.abort_request(abort_all=True)

    def _checked_ids(self, ids: Sequence[int], what: str) -> list[int]:
        """Token ids as ints in [0, vocab_size), or ValueError naming the row and position."""
        out = []
        for j, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int | np.integer):
                raise ValueError(f"{what}: token {j} must be an integer id, got {t!r}")
            if not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"{what}: token {j} is {int(t)}, outside the vocabulary [0, {self.vocab_size})"
                )
            out.append(int(t))
        return out

    def _failure(self, out: dict, done: Completion | None) -> str | None:
        """Why a request's completion cannot be returned, or None."""
        if done is not None and done.error:
            return done.error
        aborted = self._aborted(out)
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

    def _aborted(self, out: dict) -> str | None:
        reason = out["meta_info"].get("finish_reason")
        if not isinstance(reason, dict) or reason.get("type") != "abort":
            return None
        message = reason.get("message") or "aborted"
        if self._abort_reason is not None and message in ("Aborted", "Abort before prefill"):
            return f"aborted: {self._abort_reason}"
        return message

    def _submit(
        self, early: concurrent.futures.Future | None = None, judged: bool = False, **fields: Any
    ) -> list[dict]:
        """Sends one batch request; returns its outputs, or raises when the engine ends first
        (shut down from another thread, or stopped by a fault). When `early` is set first (a
        `Collector.watch_groups` future), every request of the batch still running is aborted
        and the outputs come back once upstream has ended them. `judged`: the watch's groups
        are judged here as they finish (`Collector.judge_groups`), every `JUDGE_POLL_S`."""
        obj = upstream.get("GenerateReqInput")(**fields)

        async def run():
            return await self._engine.tokenizer_manager.generate_request(obj, None).__anext__()

        # The scheduler starts the call's requests together (patches/scheduling.py, whole_calls).
        self._hooks.arrivals.expect(fields["rid"])
        future = asyncio.run_coroutine_threadsafe(run(), self._engine.loop)
        waits = [future, self._hooks.ended, *([early] if early is not None else [])]
        try:
            poll = JUDGE_POLL_S if judged else None
            while not concurrent.futures.wait(waits, poll, FIRST_COMPLETED).done:
                self.collector.judge_groups()
            if early is not None and early.done() and not future.done():
                self._abort([rid for rid in fields["rid"] if not self.collector.finished(rid)])
                concurrent.futures.wait([future, self._hooks.ended], return_when=FIRST_COMPLETED)
            if not future.done():
                raise RuntimeError(f"{self._hooks.ended.result()}; this call did not finish")
            out = future.result()
        except BaseException:
            future.cancel()
            raise
        finally:
            self._hooks.arrivals.forget(fields["rid"])
        return out if isinstance(out, list) else [out]

    def _abort(self, rids: Sequence[str]) -> None:
        engine = self._engine
        if engine is None or self._hooks.ended.done():
            return
        for rid in rids:
            try:
                engine.abort_request(rid=rid)
            except Exception:  # the engine may already be gone; nothing more to release
                logger.debug("abort of %s failed", rid, exc_info=True)

    # Weights.
    def engine_state(self):
        self._check_open()
        if self._released is not None and self._released.weights is not None:
            raise RuntimeError("engine_state: the engine's weights are released; resume first")
        return self._weights.engine_state()

    def update_weights(self, params: Any, lora: Any = None) -> None:
        """Checks, then swaps in `params` (tunix nnx state or engine layout; with `lora`, the
        frozen base those adapters apply to); flushes the cache.

        Mapping and checks run on the caller's thread; the swap and the prefix-cache flush run
        together on the scheduler thread while it is fully idle, so no step sees half of it.
        """
        with self._lock:
            self._check_open()
            if self._released is not None and self._resume_on_use:
                self._resume_with(params, lora)
                return
            if self._released is not None and self._released.weights is not None:
                raise RuntimeError(
                    "update_params: the engine's weights are released (release_memory("
                    "weights=True)); call resume_memory() first, then update_params"
                )
            leaves = self._weights.prepare(params, lora)
            self._when_idle(lambda scheduler: self._swap_and_flush(scheduler, leaves))
            self._weights_pending = False

    def _swap_and_flush(self, scheduler: Any, leaves: list) -> None:
        self._weights.swap(leaves)
        flushed, message, _ = scheduler.flush_cache()
        if not flushed:  # cannot happen while fully idle; never serve stale prefixes silently
            raise RuntimeError(f"prefix cache flush failed after the weight swap: {message}")

    # Memory.
    def release_memory(
        self,
        weights: bool = False,
        resume_on_use: bool = False,
        restore: Callable[[], tuple[Any, Any]] | None = None,
    ) -> memory.Released:
        """Frees the KV pool (and with `weights` the model's parameters) on the devices, after
        the running call if one runs (it waits for it); flushes the prefix cache first. Until
        `resume_memory`, every call that needs them raises RuntimeError naming the release;
        with `resume_on_use`, the first such call resumes instead (what a learner asks):
        `update_weights` with its weights; a call that serves, with the KV pool alone, or with
        weights released, with `restore()`'s `(params, lora)` (the weights it served before the
        release, which the trainer keeps); without `restore` that call raises, naming it."""
        if restore is not None and not (weights and resume_on_use):
            raise ValueError("release_memory: restore needs weights=True and resume_on_use=True")
        with self._lock:
            self._check_open()
            if self._released is not None:
                raise RuntimeError("release_memory: the engine's memory is already released")
            self._released = self._when_idle(lambda scheduler: self._release(scheduler, weights))
            self._resume_on_use = resume_on_use
            self._restore = restore
            return self._released

    @property
    def released(self) -> bool:
        return self._released is not None

    def resume_memory(self) -> None:
        """Allocates the KV pool again (same shapes and shardings: no recompile), empty;
        after a release with weights, they come back as zeros and `update_weights` must come
        before any `generate` or `score`. Does nothing when nothing is released."""
        with self._lock:
            self._check_open()
            self._resume()

    def _resume(self) -> None:
        """`resume_memory`, with the lock held."""
        if self._released is None:
            return
        released = self._released
        self._when_idle(lambda scheduler: memory.resume(released))
        if released.weights is not None:
            self._swap_in_zeros(released)
            self._weights_pending = True
        self._resumed()

    def _resume_with(self, params: Any, lora: Any) -> None:
        """Resumes serving `params` (lock held). The weights are mapped and swapped in before
        the KV pool comes back, so the peak is two copies of the weights (the old, or zero
        stand-ins for released ones, and the new) or the weights and the KV pool, never all
        three at once."""
        released = self._released
        if released.weights is not None:  # the mapping reads the leaves it replaces
            self._swap_in_zeros(released)
        leaves = self._weights.prepare(params, lora)
        self._when_idle(lambda scheduler: self._weights.swap(leaves))
        del leaves
        self._when_idle(lambda scheduler: memory.resume(released))
        self._weights_pending = False
        self._resumed()

    def _swap_in_zeros(self, released: memory.Released) -> None:
        """Zero stand-ins in the places of the released weights (same shapes and shardings)."""
        zeros = self._when_idle(lambda scheduler: memory.zero_weights(released))
        self._when_idle(lambda scheduler: self._weights.swap(zeros))

    def _resumed(self) -> None:
        self._released = None
        self._resume_on_use = False
        self._restore = None

    def _release(self, scheduler: Any, weights: bool) -> memory.Released:
        flushed, message, _ = scheduler.flush_cache()
        if not flushed:  # cannot happen while fully idle; never keep prefixes of freed KV
            raise RuntimeError(f"release_memory: the prefix cache flush failed: {message}")
        # The sampler's per-slot state and the last rows on the device go too; the next step
        # makes them anew (no request runs: the scheduler is idle).
        self._hooks.slot_state = self._hooks.placed_rows = self._hooks.decode_rows = None
        return memory.release(self.model_runner, weights)

    def _check_serving(self, what: str) -> None:
        self._check_open()
        if self._released is not None and self._resume_on_use:
            if self._released.weights is None:
                self._resume()
            elif self._restore is not None:
                self._resume_with(*self._restore())
            else:
                raise RuntimeError(
                    f"{what}: the engine's weights are released until the next update_params "
                    "(release_memory(weights=True) without restore=); call update_params first"
                )
        if self._released is not None:
            raise RuntimeError(
                f"{what}: the engine's memory is released (release_memory); call "
                "resume_memory() first"
            )
        if self._weights_pending:
            raise RuntimeError(
                f"{what}: the engine's weights were released and are not back yet; call "
                "update_params with the trainer's weights first"
            )

    def _when_idle(self, fn) -> Any:
        future = self._hooks.idle_work.submit(fn)
        concurrent.futures.wait([future, self._hooks.ended], STOP_TIMEOUT_S, FIRST_COMPLETED)
        if future.done() or not future.cancel():
            return future.result()
        if self._hooks.ended.done():
            raise RuntimeError(f"{self._hooks.ended.result()}; the idle work was not done")
        raise RuntimeError(
            f"the engine's scheduler did not become idle within {STOP_TIMEOUT_S:.0f}s"
        )

    # Lifecycle.
    def store_sizes(self) -> dict[str, int]:
        """Entries held per request: the collector's stores and the detokenizer's decode
        states (as of its last batch); all 0 between calls."""
        return {**self.collector.sizes(), "detokenizer_states": self._hooks.detokenizer_states}

    def _check_open(self) -> None:
        if self._hooks.ended.done():
            raise RuntimeError(self._hooks.ended.result())

    def _shut_down_after_fault(self, reason: str) -> None:
        """Called on the failing engine thread: shut down from a thread of our own, which
        waits for the running call to give up the lock (it is woken by `ended`)."""
        threading.Thread(target=self.shutdown, name="sgl-jax-rollout-shutdown", daemon=True).start()

    @property
    def vocab_parallel_sampler(self) -> bool:
        """Whether the sampler runs on the vocabulary-split logits (`EngineSettings`)."""
        return self._hooks.vocab_parallel

    def shutdown(self) -> None:
        """Stops the engine's own threads and closes its sockets; touches no other process.

        Safe from any thread and at any time: a call running in another thread ends at once
        with RuntimeError ("... was shut down ..."), then the engine is taken down.
        """
        with self._ending:
            if self._engine is None and self._hooks.released.is_set():
                return
            self._hooks.end("the rollout engine was shut down")
            with self._lock:
                self._teardown("the rollout engine was shut down")

    def _teardown(self, reason: str) -> None:
        """Takes down whatever was started, from any state of construction.

        Reads upstream attributes (commit in `availability.PINNED_COMMIT`): the scheduler
        leaves its loop at the next idle check (`patches` idle_wait_and_stop); with overlap,
        the forward thread then runs what was queued and ends (`upstream.stop_forward_thread`,
        else it would keep the model alive for the life of the process); the detokenizer
        thread, blocked on its socket, gets a message whose unpickling raises
        SystemExit (any Exception there would be an engine fault); then every socket the
        engine made (`patches` engine_sockets) is closed with linger 0, so neither
        interpreter exit nor a later garbage collection ever waits on a zmq context.
        """
        hooks, engine = self._hooks, self._engine
        hooks.end(reason)
        manager = getattr(engine, "tokenizer_manager", None) if engine is not None else None
        if manager is not None:
            with contextlib.suppress(Exception):
                manager.abort_request(abort_all=True)
        patches.deactivate(hooks)  # sets stop: the scheduler and our watchdog leave their loops
        _join_threads(SCHEDULER_THREAD_PREFIX)
        if hooks.scheduler is not None and not upstream.stop_forward_thread(
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
        self._scheduler = None
        self.model_runner = None
        self._weights = None
        self._engine = None


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


def _summary(failures: Sequence[str], total: int, what: str = "requests") -> str:
    distinct = list(dict.fromkeys(failures))
    shown = "; ".join(distinct[:3]) + ("; ..." if len(distinct) > 3 else "")
    return f"{len(failures)} of {total} {what} failed: {shown}"


def _on_devices(settings: EngineSettings, devices: list) -> EngineSettings:
    """Checks the engine's devices against the process's (`jax.devices()`: with several JAX
    processes, every process's devices, by id); without `device_indexes`, the engine takes
    the first `tp_size` devices (sgl-jax itself would demand all of them)."""
    if settings.device_indexes is not None:
        ids = {d.id for d in devices}
        bad = [i for i in settings.device_indexes if i not in ids]
        if bad:
            raise ValueError(
                f"device_indexes {list(settings.device_indexes)} name devices {bad}, but this "
                f"process sees devices {sorted(ids)} (jax.devices())"
            )
        return settings
    if settings.tp_size > len(devices):
        raise ValueError(
            f"tp_size is {settings.tp_size} devices, but this process sees {len(devices)} "
            "(jax.device_count())"
        )
    return settings.replace(device_indexes=tuple(d.id for d in devices[: settings.tp_size]))


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


def _unstarted(rid: str) -> Completion:
    """The completion of a request aborted before it started: no tokens."""
    return Completion(rid, [], [], [], None, None, {"type": "abort", "message": "not started"})


def _check_groups(groups: Sequence[int] | None, need: int | None, rows: int) -> None:
    """`generate`'s `groups` / `need_groups`: both or neither, one group per row, need in
    [1, distinct groups]."""
    if groups is None and need is None:
        return
    if groups is None or need is None:
        raise ValueError("groups and need_groups go together: set both or neither")
    if len(groups) != rows:
        raise ValueError(f"groups has {len(groups)} entries for {rows} prompts: one per prompt")
    distinct = len(set(groups))
    if isinstance(need, bool) or not isinstance(need, int) or not 1 <= need <= distinct:
        raise ValueError(f"need_groups must be an integer in [1, {distinct}], got {need!r}")


def _vocab_parallel(settings: EngineSettings, vocab: int) -> bool:
    """Whether the sampler runs on the vocabulary-split logits (logged either way when the
    tensor axis has more than one device)."""
    shards = settings.tp_size // settings.dp_size
    if shards == 1:
        return False
    if not settings.vocab_parallel_sampler:
        logger.info(
            "sampler: logits gathered over %d tensor devices (vocab_parallel_sampler off)", shards
        )
        return False
    if vocab % shards:
        logger.warning(
            "sampler: the vocabulary (%d) does not divide over %d tensor devices, so the logits "
            "are gathered to every device and the sampler runs whole there (same results)",
            vocab,
            shards,
        )
        return False
    logger.info("sampler: vocabulary-parallel over %d tensor devices", shards)
    return True
