"""The in-process sgl-jax engine with our sampler inside, as the rollout uses it.

Owns `RolloutEngine`: start sgl-jax in single-process mode from a model directory and
`EngineSettings`, then `generate` (token ids in, `Completion`s out: tokens with one logprob
and one entropy each), `score` (prefill-only logprobs of given completions), `update_weights`
(checked, atomic, serialised with generation, prefix cache flushed) and `shutdown` (stops the
engine's own threads; never signals other processes, unlike upstream's `Engine.shutdown`).

Any thread may call, many at once: `generate` and `score` calls run together, their requests
admitted into the engine's running batch as they arrive (continuous batching across calls,
each call returning as soon as its own requests finish), while weight swaps, memory release
and resume, and shutdown run alone, after the calls running when they arrive and before the
calls arriving after them (`engine.call_gate`). Requests go to sgl-jax's tokenizer manager on
the engine's own event loop (`enable_engine_loop_run_forever_daemon`).

The class checks the settings against the model and the devices, then hands each job to one
collaborator sharing that gate: requests and scoring (`engine.requests`), weight swaps
(`engine.weight_updates`), memory release and resume (`engine.memory_lifecycle`), pausing
generation in place (`engine.pausing`), the engine's start and teardown
(`engine.process`). Their mechanics must not grow back here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout.engine import memory, numerics, patches, rope_phases
from sgl_jax_rollout.engine.availability import require_sgl_jax
from sgl_jax_rollout.engine.call_gate import CallGate
from sgl_jax_rollout.engine.collector import Collector, Completion
from sgl_jax_rollout.engine.load import EngineLoad, read_load
from sgl_jax_rollout.engine.lora import LoraLayout, engine_lora_args
from sgl_jax_rollout.engine.memory_lifecycle import MemoryLifecycle
from sgl_jax_rollout.engine.pausing import InPlacePause
from sgl_jax_rollout.engine.process import (
    DETOKENIZER_THREAD_PREFIX,
    SCHEDULER_THREAD_PREFIX,
    STOP_TIMEOUT_S,
    TOKENIZER_WORKAROUND,
    EngineProcess,
)
from sgl_jax_rollout.engine.requests import (
    JUDGE_POLL_S,
    PrefillCounts,
    Requests,
    reported_input_id,
)
from sgl_jax_rollout.engine.rope_scaling import check_rope_scaling
from sgl_jax_rollout.engine.rows import RequestSpec, extra_sampler_configs
from sgl_jax_rollout.engine.settings import (
    EXPERT_COUNT_KEYS,
    EngineSettings,
    served_dtype,
    window_kv_differs,
)
from sgl_jax_rollout.engine.weight_updates import WeightUpdates
from sgl_jax_rollout.utils import compilation_cache
from sgl_jax_rollout.utils.compiles import ENGINE_START_EVENT
from sgl_jax_rollout.utils.model_dir import (
    check_weights,
    language_config,
    load_tokenizer,
    missing_key,
    read_config,
)

# Re-exported: these public names lived here before the engine was split by job.
__all__ = [
    "DETOKENIZER_THREAD_PREFIX",
    "JUDGE_POLL_S",
    "SCHEDULER_THREAD_PREFIX",
    "STOP_TIMEOUT_S",
    "TOKENIZER_WORKAROUND",
    "PrefillCounts",
    "RolloutEngine",
    "reported_input_id",
]

logger = logging.getLogger(__name__)


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
        check_weights(model_path)
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
            rope_phases=(
                rope_phases.trainer_rule(self.model_type)
                if settings.rope_phases == "trainer"
                else "inv_freq"
            ),
            numerics=numerics.trainer_rounding(self.model_type, settings.numerics),
        )
        self._gate = CallGate()
        self._process = EngineProcess(self._hooks, self._gate)
        self._memory = MemoryLifecycle(self._process, self._gate)
        self._weight_updates = WeightUpdates(self._process, self._memory, self._gate)
        self._pause = InPlacePause(
            self._process, lambda: self._memory.released is not None, STOP_TIMEOUT_S
        )
        self._requests = Requests(
            self._process,
            self._gate,
            self._memory.check_serving,
            lambda: self._weight_updates.version,
            self.collector,
            self.prefill_counts,
            vocab,
        )

        server_args = settings.server_args(
            str(model_path), jax.default_backend(), window_kv_differs(model_config)
        )
        server_args["dtype"] = served_dtype(settings.dtype, model_config)
        if lora is not None:
            server_args.update(engine_lora_args(lora, self.model_type))
        self.lora = lora  # the static LoRA layout served (None: no adapters)
        if cache_root is not None:
            compilation_cache.enable_compilation_cache(cache_root)
        start_seconds = self._process.start(server_args, self.model_type, lora)
        jax.monitoring.record_event_duration_secs(ENGINE_START_EVENT, start_seconds)
        logger.info("sgl-jax engine ready in %.1fs: %s, %s", start_seconds, model_path, settings)

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
        """One completion per (prompt, spec), in order, each stamped with the weight version
        that sampled it (`weights_version`). Specs must share their output modes; calls of
        other modes wait for the running ones to end. `max_new_tokens`: one limit for every
        row, or one per row.

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
        return self._requests.generate(
            self.settings,
            prompts,
            specs,
            max_new_tokens,
            stop,
            stop_token_ids,
            ignore_eos,
            groups,
            need_groups,
            keep_partial,
            accept,
        )

    def score(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Logprob of each completion token given the prompt and the tokens before it.

        One prefill per row under the current weights (raw `log_softmax` of the logits), no
        sampling kept. Rows with an empty completion give an empty array.
        """
        return self._requests.score(prompts, completions)

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Ends every request in flight; every call running raises RuntimeError with
        `reason`. The engine keeps serving (safe from any thread). On a paused engine it
        resumes generation too: an aborted request ends at the engine's next step."""
        self._requests.abort(reason)
        if self._pause.paused:
            self._pause.resume()

    def pause(self) -> None:
        """Pauses generation in place: the running requests keep their KV cache and no step
        starts until `resume`, where they continue (calls made meanwhile wait). Weight swaps
        and memory release or resume refuse while paused."""
        self._pause.pause()

    def resume(self) -> None:
        """Continues generation after `pause`."""
        self._pause.resume()

    @property
    def paused(self) -> bool:
        return self._pause.paused

    # Weights.
    def engine_state(self):
        return self._weight_updates.engine_state()

    def update_weights(self, params: Any, lora: Any = None) -> None:
        """Checks, then swaps in `params` (tunix nnx state or engine layout; with `lora`, the
        frozen base those adapters apply to); flushes the cache. Mapping and checks run on the
        caller's thread; the swap and the prefix-cache flush together on the scheduler thread
        while it is fully idle, so no step sees half of it. Calls running when it arrives finish
        under the old weights first; calls arriving while it waits or runs start after it, under
        the new ones."""
        with self._pause.not_paused("update_weights"):
            self._weight_updates.update(params, lora)

    def flush_prefix_cache(self) -> None:
        """Empties the prefix cache once the running calls end (calls arriving meanwhile wait);
        the weights and `weights_version` stay."""
        with self._pause.not_paused("flush_prefix_cache"):
            self._weight_updates.flush()

    @property
    def weights_version(self) -> int:
        """Weight swaps so far (`update_weights` calls that completed)."""
        return self._weight_updates.version

    def load(self) -> EngineLoad:
        """The requests the engine queues and runs, its KV pool's use and the calls at its
        gate, now (`engine.load`: read while it runs, a snapshot)."""
        return read_load(self._process.scheduler, self._gate)

    # Memory.
    def release_memory(
        self,
        weights: bool = False,
        resume_on_use: bool = False,
        restore: Callable[[], tuple[Any, Any]] | None = None,
    ) -> memory.Released:
        """Frees the KV pool (and with `weights` the model's parameters) on the devices, after
        the running calls (it waits for them; calls arriving meanwhile wait for it); flushes
        the prefix cache first. Until `resume_memory`, every call that needs them raises
        RuntimeError naming the release; with `resume_on_use`, the first such call resumes
        instead (what a learner asks): `update_weights` with its weights; a call that serves,
        with the KV pool alone, or with weights released, with `restore()`'s `(params, lora)`
        (the weights it served before the release, which the trainer keeps); without `restore`
        that call raises, naming it. Calls made from other threads meanwhile wait for the
        first one's resume."""
        with self._pause.not_paused("release_memory"):
            return self._memory.release(weights, resume_on_use, restore)

    @property
    def released(self) -> bool:
        return self._memory.released is not None

    def resume_memory(self) -> None:
        """Allocates the KV pool again (same shapes and shardings: no recompile), empty;
        after a release with weights, they come back as zeros and `update_weights` must come
        before any `generate` or `score`. Does nothing when nothing is released."""
        with self._pause.not_paused("resume_memory"):
            self._memory.resume_memory()

    # Lifecycle.
    def store_sizes(self) -> dict[str, int]:
        """Entries held per request: the collector's stores and the detokenizer's decode
        states (as of its last batch); all 0 between calls."""
        return {**self.collector.sizes(), "detokenizer_states": self._hooks.detokenizer_states}

    @property
    def vocab_parallel_sampler(self) -> bool:
        """Whether the sampler runs on the vocabulary-split logits (`EngineSettings`)."""
        return self._hooks.vocab_parallel

    def shutdown(self) -> None:
        """Stops the engine's own threads and closes its sockets; touches no other process.
        Safe from any thread and at any time: calls running in other threads end at once with
        RuntimeError ("... was shut down ..."), then the engine is taken down.
        """
        self._process.shutdown()

    # The running engine's handles, read by the rollout (`model_runner`), the tests and
    # `memory.live_bytes_at_resume` (`_weights`).
    model_runner = property(lambda self: self._process.model_runner)
    _engine = property(lambda self: self._process.engine)
    _scheduler = property(lambda self: self._process.scheduler)
    _weights = property(lambda self: self._process.weights)
    _released = property(lambda self: self._memory.released)

    def _when_idle(self, fn: Callable[[Any], Any]) -> Any:
        return self._process.when_idle(fn)


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
