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
import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout.engine import patches
from sgl_jax_rollout.engine.availability import require_sgl_jax
from sgl_jax_rollout.engine.collector import Collector, Completion
from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.engine.settings import EngineSettings

logger = logging.getLogger(__name__)

SCHEDULER_THREAD_PREFIX = "sglang::scheduler"
DETOKENIZER_THREAD_PREFIX = "sglang-jax::detokenizer"
STOP_TIMEOUT_S = 30.0


class RolloutEngine:
    def __init__(self, model_path: str | Path, settings: EngineSettings | None = None) -> None:
        settings = settings or EngineSettings()
        model_path = Path(model_path)
        config_file = model_path / "config.json"
        if not config_file.is_file():
            raise ValueError(f"model_path must be a model directory with config.json: {model_path}")
        require_sgl_jax()
        import jax

        if jax.default_backend() == "cpu" and settings.page_size != 1:
            raise ValueError(
                f"page_size must be 1 on CPU, got {settings.page_size}: at the pinned sgl-jax "
                "commit a larger page gives wrong logits to every request but the first of a "
                "batch on the CPU attention backends"
            )
        settings = _on_devices(settings, jax.device_count())
        from sgl_jax.srt.entrypoints.engine import Engine
        from transformers import AutoTokenizer

        model_config = json.loads(config_file.read_text())
        self.model_path = model_path
        self.model_type = model_config.get("model_type", "")
        self.settings = settings
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        vocab = int(model_config["vocab_size"])
        self.vocab_size = vocab
        valid = len(self.tokenizer) if len(self.tokenizer) < vocab else None
        self.collector = Collector()
        self._hooks = patches.EngineHooks(collector=self.collector, valid_vocab_size=valid)
        self._lock = threading.Lock()
        self._closed = False

        patches.apply()
        patches.activate(self._hooks)
        try:
            started = time.perf_counter()
            self._engine = Engine(**settings.server_args(str(model_path), jax.default_backend()))
        except BaseException:
            patches.deactivate(self._hooks)
            raise
        # Upstream registers Engine.shutdown, which SIGKILLs every child of this process.
        atexit.unregister(self._engine.shutdown)
        atexit.register(self.shutdown)
        self._scheduler = self._engine.scheduler_info["scheduler"]
        self._scheduler._sgl_jax_rollout_stop = self._hooks.stop
        self.model_runner = self._scheduler.tp_worker.worker.model_runner
        from sgl_jax_rollout.engine.weights import WeightSwapper

        self._weights = WeightSwapper(self.model_runner, self.model_type)
        logger.info(
            "sgl-jax engine ready in %.1fs: %s, %s",
            time.perf_counter() - started,
            model_path,
            settings,
        )

    # Generation.
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        specs: Sequence[RequestSpec],
        max_new_tokens: int,
        stop: Sequence[Sequence[str]] | None = None,
        stop_token_ids: Sequence[Sequence[int]] | None = None,
        ignore_eos: Sequence[bool] | None = None,
    ) -> list[Completion]:
        """One completion per (prompt, spec), in order. Specs must share their output modes."""
        if len(prompts) != len(specs):
            raise ValueError(f"{len(prompts)} prompts but {len(specs)} sampling specs")
        if not prompts:
            return []
        modes = {s.mode() for s in specs}
        if len(modes) > 1:
            raise ValueError(f"one call must use one logprob / entropy mode, got {modes}")
        rows = len(prompts)
        stop = stop or [()] * rows
        stop_token_ids = stop_token_ids or [()] * rows
        ignore_eos = ignore_eos or [False] * rows
        params = [
            {
                "max_new_tokens": max_new_tokens,
                "stop": list(stop[i]) or None,
                "stop_token_ids": list(stop_token_ids[i]) or None,
                "ignore_eos": bool(ignore_eos[i]),
            }
            for i in range(rows)
        ]
        rids = [uuid.uuid4().hex for _ in range(rows)]
        with self._lock:
            self._check_open()
            try:
                for rid, spec in zip(rids, specs, strict=True):
                    self.collector.register(rid, spec)
                outputs = self._submit(
                    input_ids=[list(map(int, p)) for p in prompts],
                    sampling_params=params,
                    rid=rids,
                )
                completions = [self.collector.take(rid) for rid in rids]
            except BaseException:
                self._abort(rids)
                raise
            finally:
                self.collector.forget(rids)
        for out, done in zip(outputs, completions, strict=True):
            expected = out["meta_info"]["completion_tokens"]
            if done.error or len(done.tokens) != expected:
                raise RuntimeError(
                    f"engine output for request {done.rid} is inconsistent: {done.error or ''} "
                    f"({len(done.tokens)} tokens recorded, engine reports {expected})"
                )
        return completions

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
        for i in rows:
            if not len(prompts[i]):
                raise ValueError(f"prompt {i} is empty: scoring needs at least one prompt token")
        rids = [uuid.uuid4().hex for _ in rows]
        with self._lock:
            self._check_open()
            try:
                outputs = self._submit(
                    input_ids=[[*map(int, prompts[i]), *map(int, completions[i])] for i in rows],
                    sampling_params=[{"max_new_tokens": 1, "temperature": 0.0}] * len(rows),
                    rid=rids,
                    return_logprob=[True] * len(rows),
                    logprob_start_len=[len(prompts[i]) - 1 for i in rows],
                )
            except BaseException:
                self._abort(rids)
                raise
        for i, out in zip(rows, outputs, strict=True):
            entries = out["meta_info"]["input_token_logprobs"][1:]
            ids = [e[1] for e in entries]
            if ids != [reported_input_id(int(t), self.vocab_size) for t in completions[i]]:
                raise RuntimeError(f"scoring row {i}: the engine scored other tokens than given")
            result[i] = np.asarray([e[0] for e in entries], np.float32)
        return result

    def _submit(self, **fields: Any) -> list[dict]:
        from sgl_jax.srt.managers.io_struct import GenerateReqInput

        obj = GenerateReqInput(**fields)

        async def run():
            return await self._engine.tokenizer_manager.generate_request(obj, None).__anext__()

        future = asyncio.run_coroutine_threadsafe(run(), self._engine.loop)
        try:
            out = future.result()
        except BaseException:
            future.cancel()
            raise
        return out if isinstance(out, list) else [out]

    def _abort(self, rids: Sequence[str]) -> None:
        for rid in rids:
            try:
                self._engine.abort_request(rid=rid)
            except Exception:  # the engine may already be gone; nothing more to release
                logger.debug("abort of %s failed", rid, exc_info=True)

    # Weights.
    def engine_state(self):
        return self._weights.engine_state()

    def update_weights(
        self, params: Any, lora: Any = None, lora_scaling: float | None = None
    ) -> None:
        """Checks, then swaps in `params` (tunix nnx state or engine layout; with `lora`, the
        base those adapters are merged into); flushes the cache.

        Mapping and checks run on the caller's thread; the swap and the prefix-cache flush run
        together on the scheduler thread while it is fully idle, so no step sees half of it.
        """
        with self._lock:
            self._check_open()
            leaves = self._weights.prepare(params, lora, lora_scaling)
            self._when_idle(lambda scheduler: self._swap_and_flush(scheduler, leaves))

    def _swap_and_flush(self, scheduler: Any, leaves: list) -> None:
        self._weights.swap(leaves)
        flushed, message, _ = scheduler.flush_cache()
        if not flushed:  # cannot happen while fully idle; never serve stale prefixes silently
            raise RuntimeError(f"prefix cache flush failed after the weight swap: {message}")

    def _when_idle(self, fn) -> Any:
        future = self._hooks.idle_work.submit(fn)
        try:
            return future.result(timeout=STOP_TIMEOUT_S)
        except TimeoutError:
            if future.cancel():
                raise RuntimeError(
                    f"the engine's scheduler did not become idle within {STOP_TIMEOUT_S:.0f}s"
                ) from None
            return future.result()

    # Lifecycle.
    def store_sizes(self) -> dict[str, int]:
        return self.collector.sizes()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the rollout engine was shut down")

    def shutdown(self) -> None:
        """Stops the engine's own threads and closes its sockets; touches no other process.

        Reads upstream attributes (commit in `availability.PINNED_COMMIT`): the scheduler leaves its
        loop at the next idle check (`patches` idle_wait_and_stop); the detokenizer thread,
        blocked on its socket, gets a message whose unpickling raises SystemExit (any
        Exception there makes upstream SIGQUIT the whole process); then every socket the engine
        made (`patches` engine_sockets) is closed with linger 0, so neither interpreter exit
        nor a later garbage collection ever waits on a zmq context.
        """
        if self._closed:
            return
        with self._lock:
            self._closed = True
            self._engine.abort_request(abort_all=True)
            patches.deactivate(self._hooks)
            _join_threads(SCHEDULER_THREAD_PREFIX)
            self._hooks.idle_work.close()
            scheduler = self._scheduler
            detokenizer = getattr(scheduler, "send_to_detokenizer", None)
            if detokenizer is not None:
                detokenizer.send_pyobj(_ExitThread())
                _join_threads(DETOKENIZER_THREAD_PREFIX)
            _close_sockets(
                scheduler,
                (
                    "recv_from_tokenizer",
                    "send_to_tokenizer",
                    "send_to_detokenizer",
                    "recv_from_rpc",
                ),
            )
            loop = self._engine.loop
            manager = self._engine.tokenizer_manager
            try:
                asyncio.run_coroutine_threadsafe(_cancel_tasks(manager), loop).result(
                    STOP_TIMEOUT_S
                )
            finally:
                loop.call_soon_threadsafe(loop.stop)
            self._engine.send_to_rpc.close(linger=0)
            # The rest, the detokenizer's above all (upstream never closes them): an engine
            # context finalised later with an open socket would hang the collecting thread.
            for sock in self._hooks.sockets:
                if not sock.closed:
                    sock.close(linger=0)
            self._hooks.sockets.clear()
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


def _close_sockets(owner: Any, names: Sequence[str]) -> None:
    for name in names:
        sock = getattr(owner, name, None)
        if sock is not None and not sock.closed:
            sock.close(linger=0)


async def _cancel_tasks(manager: Any) -> None:
    """Cancels the tokenizer manager's tasks and closes its sockets (on the engine's loop)."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    _close_sockets(manager, ("recv_from_detokenizer", "send_to_scheduler"))


def _on_devices(settings: EngineSettings, available: int) -> EngineSettings:
    """Checks the engine's devices against the process's; without `device_indexes`, the
    engine takes the first `tp_size` devices (sgl-jax itself would demand all of them)."""
    if settings.device_indexes is not None:
        bad = [i for i in settings.device_indexes if i >= available]
        if bad:
            raise ValueError(
                f"device_indexes {list(settings.device_indexes)} name devices {bad}, but this "
                f"process sees {available} (jax.device_count())"
            )
        return settings
    if settings.tp_size > available:
        raise ValueError(
            f"tp_size is {settings.tp_size} devices, but this process sees {available} "
            "(jax.device_count())"
        )
    return settings.replace(device_indexes=tuple(range(settings.tp_size)))


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
