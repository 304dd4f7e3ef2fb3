"""Every change we make to sgl-jax internals, in one place.

Checked against sgl-project/sglang-jax commit cddbf6f1cc33cbdd453bd8f36ff7051cf46ca176
(`python/sgl_jax/srt/...`). Each patch is named, wraps (never copies) the upstream function,
and is applied once per process (`apply`). Every upstream name reaches us through
`upstream.py`, whose `check` (run by `apply`, at engine start) fails loudly, naming it, when a
name, parameter or attribute we rely on changes. Overlap scheduling works as upstream runs it: what
the sampler needs of a request's output (tokens generated, penalty tables) lives on the device
per request slot (`slot_state.py`), never read from the host's lagging output ids.

Containment (docs/design.md section 8): no fault on an engine thread may take the trainer's
process down. `step_guard` keeps a failing step to its own requests; `contained_signals`
and `watchdog` turn upstream's last resort, SIGQUIT to this process (or its parent), into an
engine fault that ends the engine alone; our scheduler-side hooks fail their requests
instead of raising.

- `sampler_class`: `model_executor.model_runner.Sampler` -> `RolloutSampler`. Replaced before
  the Engine is built, so the runner's `initialize_jit` and precompile include our sampler.
- `worker_batch_rows`: wraps `ScheduleBatch.get_model_worker_batch` to attach our per-row
  settings (`rows.build_rows`) and request slots for the batch's requests, in row order (a
  decode step with the same requests in the same slots as the last one reuses its rows).
- `sampling_metadata_rows`: wraps `SamplingMetadata.from_model_worker_batch` to return a
  `RolloutSamplingMetadata` carrying those rows on the mesh (neutral rows for precompile;
  rows reused from the last step reuse its metadata, stock children included: our sampler
  reads none of them, and upstream would rebuild and transfer them every step).
- `sample_with_slot_state`: wraps `ModelRunner.sample` (run on the thread that runs the step:
  the forward thread with overlap): hands the sampler the slot state and keeps the advanced
  state it returns; a sampler that fails (a compile of a new config) is run again with neutral
  rows, and the step's requests are failed from the scheduler thread; while upstream
  precompiles, runs the step's sampler again under each extra config
  (precompile_sampler_modes).
- `step_values`: wraps `Scheduler.process_batch_result` (without overlap) and
  `ModelWorkerClient.resolve_last_batch_result` (with overlap: the step's outputs reach the
  scheduler there) to hand the step's per-row sampler outputs to the collector before the
  result is processed. With overlap a request that finished at step t is in step t + 1 too;
  the collector has closed it and ignores that value.
- `outputs_in_flight`: wraps `ModelWorker._materialize_logprobs_to_host`, where upstream
  copies a step's logprobs to the host as soon as the sampler returns them (a blocking
  `device_get`; with overlap, on the forward thread, which then cannot queue step t + 1 behind
  step t). Our per-row outputs (entropy, top logprobs) only start their copies there; a step
  whose batch asks upstream for no logprobs (`return_logprob`, `return_output_logprob_only`:
  scoring, sgl-jax's own logprob requests) also hands upstream no logprobs, and ours go with
  the per-row outputs (`RolloutLogitsOutput.rollout_logprobs`). The collector reads them all
  on the scheduler thread (`_collect`), when the step is processed.
- `record_before_stream`: wraps `Scheduler.stream_output` so per-token values are recorded
  (and completions finalised) before sgl-jax sends the output to the caller.
- `native_attention_per_rank`: wraps `NativeAttention.__call__` (the attention sgl-jax uses
  on CPU) so that with dp > 1 each dp rank attends over its own batch section and KV shard
  (`dp_attention.py`); upstream mixes the ranks. One dp rank: upstream runs unchanged.
- `attention_logit_cap`: in the same wrapper, a layer's `logit_cap` (Gemma 2's
  `attn_logit_softcapping`, 50) reaches the CPU attention. An upstream bug fix: the TPU
  kernel soft-caps the scores (`flashattention_backend.py:723`, `soft_cap=layer.logit_cap`),
  the native backend never reads `logit_cap` (`native_backend.py:73-113, 169-327`), so on
  CPU Gemma 2 was served without its attention soft-cap. `forward_attention` takes no cap, so
  the module's `jnp` is replaced by `_ScoreCappingNumpy`, which soft-caps the one score
  einsum (`"qhd,khd->qhk"`, `native_backend.py:256`) while a capped layer is traced:
  `cap * tanh(s * scale / cap) / scale`, which upstream then multiplies by `scale`.
- `scheduler_of_engine`: wraps `Scheduler.__init__` to tie the scheduler to the engine that
  builds it before any of it runs, so a shutdown reaches it from any state of a start.
- `runner_of_engine`: wraps `ModelRunner.__init__` the same way for the model runner: with
  overlap, a step already queued on the forward thread when the engine stops still runs its
  sampler with that engine's slot state (the process may hold no active engine by then).
- `step_guard`: wraps `Scheduler.run_batch`: a step that raises fails exactly its requests
  (aborted through upstream's `abort_request`, the error as message) and is run again with
  neutral greedy rows and the precompiled sampler, so upstream finishes them and frees their
  cache as for any abort. A second failure is an engine fault.
- `contained_signals`: `psutil` as `managers.scheduler`, `managers.detokenizer_manager`,
  `managers.tp_worker` and `managers.tp_worker_overlap_thread` see it: their thread handlers
  end every exception with `Process().send_signal(SIGQUIT)` (`scheduler.py:2988, 3015, 3037`,
  `detokenizer_manager.py:344, 362`, `tp_worker.py:314`), the overlap forward thread's with
  `psutil.Process().parent()` taken at start (`tp_worker_overlap_thread.py:69, 111`), the
  process that launched the trainer; here SIGQUIT is an engine fault.
- `watchdog`: replaces `Scheduler.watchdog_thread` (upstream's loop never exits, so every
  shut-down scheduler stays alive, and it SIGQUITs `psutil.Process().parent()`, in
  single-process mode the process that launched the trainer): same rule, engine fault.
- `sampler_key_typed`: wraps `ModelRunner.initialize_jit`. Upstream keeps its sampler's base
  key as raw `PRNGKey` data (`model_runner.py:175`) and folds the step into it inside the
  jitted sampler (`:296`), which reads raw data with whatever `jax_default_prng_impl` is set
  when a sampler config is traced: a trainer that changes it (to rbg, unsafe_rbg) after the
  engine started fails every new trace. A typed key carries its implementation.
- `whole_calls`: wraps `Scheduler.recv_requests`: once part of a call's requests has reached
  the scheduler, it receives until the rest has too (`arrivals.py`; at most
  `CALL_ARRIVAL_WAIT_S`), so each call starts as one batch. Upstream's tokenizer manager sends
  a batch one request per message and the scheduler took what had arrived: a call's first
  requests were often prefilled alone, one model step more per call.
- `finished_leave_first`: wraps `Scheduler.get_new_batch_prefill`: requests that finished at
  the last step leave the running batch before new ones are admitted. Upstream filters them
  out only after admission (`update_running_batch`, `scheduler.py:2365`, called when no
  prefill was formed) and counts them against `max_running_requests` until then
  (`scheduler.py:2169-2172`): a call sent right after another one, before the scheduler's
  next turn, had its first prefill cut by the previous call's size (12 of 16 after a call of
  4), one model step more.
- `no_step_after_the_last`: wraps `Scheduler.update_running_batch`: with overlap scheduling,
  a request whose token in flight (the step launched last, not processed yet: the
  scheduler's `result_queue`) is its last by length (`max_new_tokens`) leaves the running
  batch before the next decode step is built. Upstream builds that step before it knows
  (`event_loop_overlap`, `scheduler.py:1141-1180`), runs the request one more step and
  discards the token (`scheduler_output_processor_mixin.py:475`): one model step more per
  call whose requests end by length, as RL rollouts' truncated ones do (65 steps instead of
  64 at 64 new tokens). Requests that may still end by a stop token or string keep it.
- `idle_wait_and_stop`: wraps `Scheduler.on_idle`: a fully idle scheduler runs the engine's
  `IdleWork` (weight swap, cache flush), then waits on its sockets and on the work pipe
  (upstream spins a core at 100%), and exits its thread when the engine is shut down.
- `scheduler_faulthandler`: the `faulthandler` that `managers.scheduler` calls at the start of
  its thread (`scheduler_loop_after_create`, `scheduler.py:3027`, outside its try) enables on
  the process's real stderr where `sys.stderr` has no file descriptor (Jupyter, pytest's
  capture). Upstream's bare `faulthandler.enable()` raises `io.UnsupportedOperation` there,
  the scheduler thread dies before its loop, and every call then waits for a step that never
  comes.
- `engine_sockets`: wraps `get_zmq_socket` where the engine's components import it
  (`entrypoints.engine`, `managers.scheduler`, `managers.tokenizer_manager`,
  `managers.detokenizer_manager`): every engine socket gets `LINGER` 0 and is recorded in the
  running engine's hooks, so shutdown closes all of them. Upstream never closes the
  detokenizer's sockets; when the garbage collector later finalises that shut-down engine's
  zmq context, the sockets' weak references are already cleared, `Context.term` waits for
  sockets nobody will close, and the thread that happened to run the collection hangs forever
  (seen as a full test run stuck inside a jit trace).
- `cache_loc_copied`: wraps `ScheduleBatch._merge_cache_loc` so that on CPU each step's
  `cache_loc` (the KV slots attention reads) is a fresh array. Upstream returns a view of one
  persistent host buffer (`req_to_token_pool.cache_loc_host_buf`, `schedule_batch.py:2400,
  2408`) and uploads it with `device_array` (`forward_batch_info.py:362`). JAX's CPU client
  aliases a host buffer it is given when the buffer is 64-byte aligned (zero-copy), so under
  overlap scheduling the scheduler's writes for step t + 1 reach step t's forward, still
  running on the forward thread: every request of a batch but the first attends over other
  slots. Whether the buffer is aligned depends on where numpy allocated it, so about half the
  engine starts gave wrong logits with overlap on, the same ones each time. Off CPU the
  upload copies the buffer and upstream runs unchanged.
- `llama3_rope_scaling`: wraps `layers.embeddings.Llama3RotaryEmbedding.__init__` so the
  rotary phases use the llama3-scaled frequencies. Upstream's base class computes
  `_inv_freq_np` (what `_compute_cos_sin` reads) unscaled in its `__init__`, and the llama3
  subclass only overrides `_compute_inv_freq`, which nothing on that path calls: every Llama
  3.1 / 3.2 checkpoint (rope_scaling "llama3") is served with unscaled RoPE, another function
  than the checkpoint's (0.2 nats at positions past 1,024 on a tiny replica).
- `attention_head_dim_unpadded`: wraps `layers.attention.native_backend.forward_attention`
  (the attention sgl-jax runs on CPU; `NativeAttention.__call__` and our dp path both call it
  through the module) so its output has the model's head_dim. An upstream bug fix: the KV pool
  pads head_dim to a multiple of 128 (`model_runner.py:1102`, `memory_pool.py:70`),
  `forward_attention` pads q to match (`native_backend.py:234-239`) and returns
  `num_heads * padded` columns (`native_backend.py:326-327`), so every model with a head_dim
  that is not a multiple of 128 (Llama 3.2, SmolLM2: 64) fails at its first `o_proj`. The pad
  of V is zeros, so the first head_dim columns of each head are the attention output. Needed
  until upstream slices it off: `test_attention_head_dim_unpadded_matches_unpadded_attention`
  passes without the patch then.
- `precompile_sampler_modes`: wraps `ModelWorker.run_precompile` (and `ModelRunner.sample`,
  in `sample_with_slot_state`): while upstream precompiles (every extend and decode batch
  bucket), each sampler step is run again with neutral rows under every extra
  `SamplerConfig` of the engine (the modes the rollout derives from its defaults and
  `EngineSettings.sampler_modes`), so a run meets no sampler compile for those modes.
  Upstream precompiles its one sampler.
- `precompile_overlap_gather`: in the same place, with overlap, each precompiled step's token
  ids also go through the overlap worker's `async_gather_fn` (a jitted identity onto a
  replicated sharding that the forward thread applies to every step's ids,
  `tp_worker_overlap_thread.py:170`). Upstream's precompile never calls it, so it compiled
  once per batch bucket in the middle of a run (seen in the 20-step demo).
- `detokenizer_forgets_finished`: wraps `DetokenizerManager.handle_batch_token_id_out` to drop
  a finished request's decode state (its token ids and text). Upstream keeps every request's
  state until `SGLANG_DETOKENIZER_MAX_STATES` (65,536) requests have passed
  (`detokenizer_manager.py:36, 85, 316`): host memory that grows with every completion of an RL
  run, tens of KB per 1k-token completion, gigabytes at the cap. The count left after each
  batch is reported by `RolloutEngine.store_sizes()` as `detokenizer_states`.
- `expert_ids_sync_when_captured`: wraps `ModelWorker.__init__` so the worker's expert-ids
  queue takes a step's routed-expert ids only while a capturer records them. Upstream puts
  them on `sync_queue` after every forward (`tp_worker.py:525, 540`), which wakes its sync
  thread to hand them to the process's capturer (`tp_worker.py:316-319`); for every model
  but a MoE served with `enable_return_routed_experts` that capturer is the no-op one
  (`routed_experts_capturer.py:117, 342`). The wake lands between the forward and the
  sampler, where the woken thread takes the scheduler's core and then waits for the GIL it
  holds: with the capturer off it is all cost (measured on the same engine, calls
  alternating: 0.34 against 0.16 ms per step between the two at Qwen3-0.6B size on CPU).
- `detokenizer_skips_our_text`: in the same wrapper, the requests our rollout submitted reach
  upstream's incremental detokenizer with only their last id. Their text is never read: the
  rollout decodes the collector's tokens once, at the end. Upstream decodes every request's ids
  (prompt tail included, through a per-id Python flatten) at every output message (every 50
  tokens and at the end): measured with sgl-jax's `skip_tokenizer_init` on the stock engine,
  0.26 ms of host time per decode step at 64 requests x 64 tokens on CPU. One id stays because
  upstream's stop trimming asserts a non-empty list (`trim_matched_stop`,
  `detokenizer_manager.py:116`); stop strings are matched by the scheduler, as before.
"""

from __future__ import annotations

import collections
import contextvars
import copy
import dataclasses
import faulthandler
import functools
import hashlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zmq
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.arrivals import Arrivals
from sgl_jax_rollout.engine.collector import Collector, StepValues
from sgl_jax_rollout.engine.dp_attention import per_rank_native_attention
from sgl_jax_rollout.engine.idle_work import IdleWork
from sgl_jax_rollout.engine.rows import (
    RequestSpec,
    build_rows,
    pack_rows,
    sampler_config,
    slot_table,
)
from sgl_jax_rollout.engine.slot_state import SlotState, new_slot_state
from sgl_jax_rollout.sampling.batch import SamplerConfig
from sgl_jax_rollout.sampling.options import SamplingOptions

logger = logging.getLogger(__name__)

IDLE_WAIT_MS = 50
# whole_calls: how long the scheduler waits for the rest of a call whose first requests arrived
# (they are sent microseconds apart; the call itself stops the wait when it fails).
CALL_ARRIVAL_WAIT_S = 1.0
_MARK = "__sgl_jax_rollout_patch__"
_APPLY_LOCK = threading.Lock()
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


def _hooks() -> EngineHooks | None:
    return _active


def apply(server_args: Iterable[str] = ()) -> None:
    """Checks sgl-jax against the names we rely on (`upstream.check`, with the `Engine`
    keywords `server_args`), then installs every patch once per process (idempotent)."""
    with _APPLY_LOCK:
        upstream.check(server_args)
        from sgl_jax_rollout.engine.sampler_module import RolloutSampler

        get = upstream.get
        upstream.module("model_executor.model_runner").Sampler = RolloutSampler
        scheduler = upstream.module("managers.scheduler")
        if not isinstance(scheduler.faulthandler, _SchedulerFaultHandler):
            scheduler.faulthandler = _SchedulerFaultHandler()
        for path in upstream.SOCKET_MODULES:
            _wrap(upstream.module(path), "get_zmq_socket", _engine_socket)
        for path in upstream.SIGNALLING_MODULES:
            module = upstream.module(path)
            if not isinstance(module.psutil, _ContainedPsutil):
                module.psutil = _ContainedPsutil()
        _wrap(get("Scheduler"), "__init__", _scheduler_of_engine)
        _wrap(get("ModelRunner"), "__init__", _runner_of_engine)
        _wrap(get("Scheduler"), "run_batch", _step_guard)
        _wrap(get("Scheduler"), "watchdog_thread", _watchdog)
        _wrap(get("ModelRunner"), "initialize_jit", _typed_sampler_key)
        _wrap(get("ScheduleBatch"), "get_model_worker_batch", _worker_batch_rows)
        _wrap(get("ScheduleBatch"), "_merge_cache_loc", _cache_loc_copied)
        _wrap_classmethod(
            get("SamplingMetadata"), "from_model_worker_batch", _sampling_metadata_rows
        )
        _wrap(get("Scheduler"), "process_batch_result", _step_values)
        _wrap(get("Scheduler"), "stream_output", _record_before_stream)
        _wrap(get("Scheduler"), "on_idle", _idle_wait_and_stop)
        _wrap(get("Scheduler"), "recv_requests", _whole_calls)
        _wrap(get("Scheduler"), "get_new_batch_prefill", _finished_leave_first)
        _wrap(get("Scheduler"), "update_running_batch", _no_step_after_the_last)
        _wrap(get("NativeAttention"), "__call__", _native_attention)
        native = upstream.module("layers.attention.native_backend")
        if not isinstance(native.jnp, _ScoreCappingNumpy):
            native.jnp = _ScoreCappingNumpy()
        _wrap(
            upstream.module("layers.attention.native_backend"), "forward_attention", _unpadded_heads
        )
        _wrap(get("Llama3RotaryEmbedding"), "__init__", _llama3_scaled_frequencies)
        _wrap(get("DetokenizerManager"), "handle_batch_token_id_out", _detokenize)
        _wrap(get("ModelWorker"), "__init__", _expert_ids_sync_when_captured)
        _wrap(get("ModelWorker"), "run_precompile", _precompiling)
        _wrap(get("ModelWorker"), "_materialize_logprobs_to_host", _outputs_in_flight)
        _wrap(get("ModelRunner"), "sample", _sample_with_slot_state)
        _wrap(get("ModelWorkerClient"), "resolve_last_batch_result", _overlapped_step_values)


def _wrap(owner: Any, name: str, wrapper) -> None:
    original = getattr(owner, name)
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def patched(*args, **kwargs):
        return wrapper(original, *args, **kwargs)

    setattr(patched, _MARK, True)
    setattr(owner, name, patched)


def _wrap_classmethod(owner: type, name: str, wrapper) -> None:
    original = owner.__dict__[name].__func__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def patched(cls, *args, **kwargs):
        return wrapper(functools.partial(original, cls), *args, **kwargs)

    setattr(patched, _MARK, True)
    setattr(owner, name, classmethod(patched))


# Patch bodies.
def _llama3_scaled_frequencies(original, self, *args, **kwargs):
    """llama3_rope_scaling: the phases read `_inv_freq_np`; give it the scaled frequencies
    (upstream's own `_compute_inv_freq`, evaluated eagerly even inside a model-building trace)."""
    original(self, *args, **kwargs)
    with jax.ensure_compile_time_eval():
        self._inv_freq_np = np.asarray(self._compute_inv_freq(self.base), np.float32)


def _native_attention(original, self, q, k, v, layer, *args, **kwargs):
    """native_attention_per_rank and attention_logit_cap, on upstream's CPU attention."""
    cap = getattr(layer, "logit_cap", None)
    if not cap:
        return per_rank_native_attention(original, self, q, k, v, layer, *args, **kwargs)
    scale = layer.scaling if layer.scaling is not None else 1.0 / float(layer.head_dim) ** 0.5
    token = _SCORE_CAP.set((float(cap), float(scale)))
    try:
        return per_rank_native_attention(original, self, q, k, v, layer, *args, **kwargs)
    finally:
        _SCORE_CAP.reset(token)


# (cap, scale) of the attention layer being traced, for `_ScoreCappingNumpy`.
_SCORE_CAP: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "score_cap", default=None
)
SCORE_SUBSCRIPTS = "qhd,khd->qhk"  # upstream's attention scores, `native_backend.py:256`


class _ScoreCappingNumpy:
    """attention_logit_cap: `jax.numpy` as `layers.attention.native_backend` sees it, whose
    score einsum is soft-capped while a capped layer is traced (`_SCORE_CAP`)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)

    def einsum(self, subscripts, *operands, **kwargs):
        out = jnp.einsum(subscripts, *operands, **kwargs)
        cap = _SCORE_CAP.get()
        if cap is None or subscripts != SCORE_SUBSCRIPTS:
            return out
        limit, scale = cap
        return limit * jnp.tanh(out * (scale / limit)) / scale


def _unpadded_heads(
    original,
    q,
    k_cache,
    v_cache,
    seq_lengths,
    loc,
    extend_prefix_lens,
    extend_seq_lens,
    num_heads,
    *args,
    **kwargs,
):
    """attention_head_dim_unpadded: upstream's attention output with each head cut back from
    the KV pool's padded width to q's head_dim."""
    out = original(
        q,
        k_cache,
        v_cache,
        seq_lengths,
        loc,
        extend_prefix_lens,
        extend_seq_lens,
        num_heads,
        *args,
        **kwargs,
    )
    return unpadded_heads(out, q.shape[-1] if q.ndim == 3 else q.shape[-1] // num_heads, num_heads)


def unpadded_heads(
    out: Float[Array, "tokens width"], head_dim: int, num_heads: int
) -> Float[Array, "tokens heads_x_head_dim"]:
    """`out` ([tokens, num_heads * w]) with each head's first `head_dim` columns, where `w` is
    the pool's padding of `head_dim` to a multiple of 128; any other width is returned as is
    (models whose V head is narrower than their q head)."""
    width = out.shape[-1] // num_heads
    if width == head_dim or width != -(-head_dim // 128) * 128:
        return out
    tokens = out.shape[0]
    return out.reshape(tokens, num_heads, width)[..., :head_dim].reshape(tokens, -1)


def _cache_loc_copied(original, self, *args, **kwargs):
    """cache_loc_copied: on CPU, a copy of upstream's view of its persistent host buffer (the
    CPU client may alias the buffer, which the next step rewrites while this one runs)."""
    cache_loc = original(self, *args, **kwargs)
    return cache_loc.copy() if jax.default_backend() == "cpu" else cache_loc


def _engine_socket(original, *args, **kwargs):
    """engine_sockets: the upstream socket, with LINGER 0, recorded for shutdown."""
    socket = original(*args, **kwargs)
    socket.setsockopt(zmq.LINGER, 0)
    hooks = _hooks()
    if hooks is not None:
        hooks.sockets.append(socket)
    return socket


class _SchedulerFaultHandler:
    """scheduler_faulthandler: `faulthandler`, with `enable()` falling back to the process's
    real stderr where `sys.stderr` has no file descriptor."""

    def __getattr__(self, name: str) -> Any:
        return getattr(faulthandler, name)

    def enable(self, file: Any = None, all_threads: bool = True) -> None:
        if file is None:
            try:
                sys.stderr.fileno()
                file = sys.stderr
            except (AttributeError, OSError, ValueError):
                file = sys.__stderr__
        faulthandler.enable(file=file, all_threads=all_threads)


def _worker_batch_rows(original, self, *args, **kwargs):
    """worker_batch_rows: attach (config, host rows) for this batch's requests."""
    mwb = original(self, *args, **kwargs)
    hooks = _hooks()
    if hooks is None:
        return mwb
    padded = len(mwb.sampling_info.temperatures)
    if hooks.neutral_rows:  # a failed step run again: greedy rows, the precompiled config
        mwb.rollout_rows = _neutral_rows(hooks.valid_vocab_size, padded)
        return mwb
    reqs = _requests_by_row(self)
    # Extend rows join their slot: a new request, a chunk of one, or a retracted one coming
    # back (whose output ids are complete by then). Decode rows read their slot's state, so
    # a decode step with the same requests in the same slots has the same rows as the last.
    joining = self.forward_mode.is_extend()
    key = (padded, tuple(None if r is None else (r.rid, r.req_pool_idx) for r in reqs))
    cached = hooks.decode_rows
    if not joining and cached is not None and cached[0] == key:
        mwb.rollout_rows = cached[1]
        return mwb
    registered, specs = [], []
    for req in reqs:
        spec = None if req is None else hooks.collector.spec_for(req.rid)
        if spec is not None:
            registered.append(spec)
        specs.append(spec or (None if req is None else _fallback_spec(req)))
    config = sampler_config(registered, hooks.valid_vocab_size)
    if joining:
        prompts = [[] if req is None else req.origin_input_ids for req in reqs]
        outputs = [[] if req is None else req.output_ids for req in reqs]
    else:
        prompts = outputs = [[]] * len(reqs)
    slots = slot_table([None if r is None else r.req_pool_idx for r in reqs], joining, padded)
    rids = [req.rid for req in reqs if req is not None]
    mwb.rollout_rows = (config, build_rows(specs, prompts, outputs, padded, config), slots, rids)
    hooks.decode_rows = None if joining else (key, mwb.rollout_rows)
    return mwb


def _neutral_rows(valid_vocab_size: int | None, size: int, config: SamplerConfig | None = None):
    """(config, rows, slots, request ids) of a batch of greedy padding rows: precompile, and a
    failed step run again."""
    config = config or sampler_config([], valid_vocab_size)
    return config, build_rows([], [], [], size, config), slot_table([], True, size), []


def _requests_by_row(batch: Any) -> list[Any]:
    """The request at each row of the batch, None at padding rows. With dp > 1, rank r's
    requests start at row r * `per_dp_bs_size` (upstream `ScheduleBatch._merge_batch_metadata`;
    set by `get_model_worker_batch`)."""
    rows: list[Any] = []
    for rank, info in enumerate(batch.reqs_info):
        if rank:
            rows += [None] * (rank * batch.per_dp_bs_size - len(rows))
        rows += list(info.reqs or [])
    return rows


def _fallback_spec(req: Any) -> RequestSpec:
    """Settings for a request we did not submit (sgl-jax's own warm-up, direct engine users)."""
    top_k_all = upstream.get("TOP_K_ALL")
    p = req.sampling_params
    seed = p.sampling_seed
    if seed is None:
        seed = int.from_bytes(hashlib.sha256(str(req.rid).encode()).digest()[:8], "little") >> 1
    try:
        options = SamplingOptions(
            temperature=float(p.temperature),
            top_k=-1 if p.top_k >= top_k_all else int(p.top_k),
            top_p=float(p.top_p),
            min_p=float(p.min_p),
            seed=seed,
        )
    except ValueError:
        options = SamplingOptions(temperature=0.0, seed=seed)
    return RequestSpec(options=options)


def _sampling_metadata_rows(original, batch, pad_size=0, mesh=None, vocab_size=32000):
    """sampling_metadata_rows: stock metadata plus our rows, on the mesh. The rows of the last
    step again (a decode step of the same requests in the same slots) reuse its metadata, already
    on the mesh: of the stock children, which upstream rebuilds and transfers every step, our
    sampler reads none (only their shapes, which the same batch keeps)."""
    hooks = _hooks()
    rows = getattr(batch, "rollout_rows", None)
    placed = hooks.placed_rows if hooks is not None else None
    if rows is not None and placed is not None and placed[0] is rows:
        return copy.copy(placed[1])
    stock = original(batch, pad_size, mesh, vocab_size)
    if rows is None:
        # Precompile and requests outside our engine: neutral greedy rows, default config.
        valid = hooks.valid_vocab_size if hooks is not None else None
        return _with_rows(stock, *_neutral_rows(valid, len(batch.sampling_info.temperatures)), mesh)
    metadata = _with_rows(stock, *rows, mesh)
    if hooks is not None:
        hooks.placed_rows = (rows, metadata)
    return metadata


def _with_rows(
    stock: Any, config: SamplerConfig, host_rows: Any, slots: Any, rids: list[str], mesh: Any
):
    """Stock `SamplingMetadata` children plus our rows placed on the mesh (one transfer of
    `PackedRows`), `config` as aux; the step's request ids as a plain attribute (for
    `sample_with_slot_state`, which sees the object before jit)."""
    from sgl_jax_rollout.engine.sampler_module import RolloutSamplingMetadata

    packed = pack_rows(host_rows, slots)
    device_rows = jax.device_put(packed, NamedSharding(mesh, P("data", None)))
    children, aux = stock.tree_flatten()
    aux = {k: v for k, v in aux.items() if k not in RolloutSamplingMetadata.STATIC_FIELDS}
    metadata = RolloutSamplingMetadata.tree_unflatten(
        {**aux, "rollout_config": config, "rollout_vocab_parallel": False},
        (*children[: upstream.STOCK_METADATA_CHILDREN], device_rows, None),
    )
    metadata.rollout_rids = rids
    return metadata


def _precompiling(original, self, *args, **kwargs):
    """precompile_sampler_modes, part 1: mark the precompile."""
    hooks = _hooks()
    if hooks is None:
        return original(self, *args, **kwargs)
    hooks.precompiling = True
    try:
        return original(self, *args, **kwargs)
    finally:
        hooks.precompiling = False


def _sample_with_slot_state(original, self, logits_output, sampling_metadata):
    """sample_with_slot_state: the sampler step with the slot state in and out; a failing
    sampler fails its requests; while precompiling, every extra config is compiled too."""
    hooks = getattr(self, "_sgl_jax_rollout_hooks", None)
    if hooks is None:
        return original(self, logits_output, sampling_metadata)
    try:
        result = _sample_step(original, self, hooks, logits_output, sampling_metadata)
    except Exception as err:
        if hooks.precompiling:
            raise
        # A sampler that cannot run (typically a new config that fails to compile) fails its
        # requests (on the scheduler thread, `_collect`); the step runs with neutral rows.
        rids = frozenset(getattr(sampling_metadata, "rollout_rids", []))
        hooks.failed_samples.append((rids, err))
        size = sampling_metadata.rollout_rows.size
        neutral = _with_rows(
            sampling_metadata, *_neutral_rows(hooks.valid_vocab_size, size), self.mesh
        )
        return _sample_step(original, self, hooks, logits_output, neutral)
    if hooks.precompiling:
        size = sampling_metadata.rollout_rows.size
        for config in hooks.sampler_configs:
            rows = _neutral_rows(hooks.valid_vocab_size, size, config)
            extra = _with_rows(sampling_metadata, *rows, self.mesh)
            jax.block_until_ready(_sample_step(original, self, hooks, logits_output, extra))
        _precompile_overlap_gather(hooks, result[0])
    return result


def _precompile_overlap_gather(hooks: EngineHooks, ids: Any) -> None:
    """precompile_overlap_gather: the overlap worker's gather of a step's ids, compiled for
    this batch bucket while upstream precompiles (nothing without overlap)."""
    worker = getattr(hooks.scheduler, "tp_worker", None)
    if isinstance(worker, upstream.get("ModelWorkerClient")):
        jax.block_until_ready(worker.async_gather_fn(ids))


def _sample_step(original, runner, hooks: EngineHooks, logits_output, sampling_metadata):
    """One run of the sampler with the slot state (made at the first step, its tables at the
    first step with penalties); keeps the advanced state."""
    config = sampling_metadata.rollout_config
    state = hooks.slot_state
    if state is None or (config.penalties and not state.has_tables):
        vocab = logits_output.next_token_logits.shape[-1] if config.penalties else None
        sharding = NamedSharding(runner.mesh, P())
        fresh = new_slot_state(runner.req_to_token_pool.size, vocab, sharding)
        # Running requests keep their counts when the tables first appear; their zeroed
        # tables are only read by rows without penalties (a penalised row joins with its ids).
        state = fresh if state is None else fresh._replace(num_generated=state.num_generated)
    metadata = copy.copy(sampling_metadata)
    metadata.rollout_state = state if config.penalties else state.without_tables()
    metadata.rollout_vocab_parallel = hooks.vocab_parallel
    ids, logits, out = original(runner, logits_output, metadata)
    advanced = out.rollout_state
    out.rollout_state = None
    hooks.slot_state = (
        advanced if config.penalties else state._replace(num_generated=advanced.num_generated)
    )
    return ids, logits, out


def _step_values(original, self, batch, result, *args, **kwargs):
    """step_values: give the collector this step's per-row values, then process the result.
    With overlap the values arrive in `resolve_last_batch_result`, called inside."""
    from sgl_jax_rollout.engine.sampler_module import RolloutLogitsOutput

    hooks = _hooks()
    if hooks is None:
        return original(self, batch, result, *args, **kwargs)
    if self.enable_overlap:
        hooks.processing = (self, batch)
    else:
        out = getattr(result, "logits_output", None)
        if isinstance(out, RolloutLogitsOutput):
            _collect(hooks, self, batch, out)
    try:
        return original(self, batch, result, *args, **kwargs)
    finally:
        hooks.processing = None
        hooks.collector.end_step()


def _overlapped_step_values(original, self, *args, **kwargs):
    """step_values, overlap half: the last step's outputs, just resolved, to the collector."""
    from sgl_jax_rollout.engine.sampler_module import RolloutLogitsOutput

    resolved = original(self, *args, **kwargs)
    hooks = _hooks()
    if (
        hooks is not None
        and hooks.processing is not None
        and isinstance(resolved[0], RolloutLogitsOutput)
    ):
        _collect(hooks, *hooks.processing, resolved[0])
    return resolved


def _outputs_in_flight(original, self, logits_output, model_worker_batch, *args, **kwargs):
    """outputs_in_flight: our per-row outputs start their copies to the host; upstream
    materialises logprobs only for a batch that asks it for them."""
    from sgl_jax_rollout.engine.sampler_module import RolloutLogitsOutput

    if isinstance(logits_output, RolloutLogitsOutput):
        batch = model_worker_batch
        if not (batch.return_logprob or batch.return_output_logprob_only):
            logits_output.rollout_logprobs = logits_output.next_token_logprobs
            logits_output.next_token_logprobs = None
        jax.copy_to_host_async(
            (
                logits_output.rollout_logprobs,
                logits_output.rollout_entropy,
                logits_output.rollout_top_logprob_ids,
                logits_output.rollout_top_logprobs,
            )
        )
    return original(self, logits_output, model_worker_batch, *args, **kwargs)


def _collect(hooks: EngineHooks, scheduler: Any, batch: Any, out: Any) -> None:
    """Fails the requests of this step if its sampler failed, then stashes its values.

    A failure here fails the batch's requests (`_fail_requests`); the step is still processed,
    so upstream finishes them and frees their cache."""
    rows = _requests_by_row(batch)
    filled = [i for i, req in enumerate(rows) if req is not None]
    _fail_if_its_sampler_failed(hooks, scheduler, [rows[i] for i in filled])
    try:
        # Our outputs have every padded row (their copies started in `outputs_in_flight`):
        # gather the requests' rows. Where upstream materialised the logprobs it has
        # gathered them to the same rows already (its `logits_indices_selector`: the requests
        # in row order, padding dropped).
        per_row = (
            out.rollout_logprobs,
            out.rollout_entropy,
            out.rollout_top_logprob_ids,
            out.rollout_top_logprobs,
        )
        own_logprobs, entropy, top_ids, top_values = (
            None if x is None else np.asarray(x)[filled] for x in per_row
        )
        logprobs = out.next_token_logprobs if own_logprobs is None else own_logprobs
        values = StepValues(  # per-row floats as lists: the collector reads one per request
            logprobs=None if logprobs is None else np.asarray(logprobs).tolist(),
            entropy=None if entropy is None else entropy.tolist(),
            top_logprob_ids=top_ids,
            top_logprobs=top_values,
        )
        hooks.collector.stash_step([rows[i] for i in filled], values)
    except Exception as err:
        _fail_requests(scheduler, _batch_requests(batch), hooks, "collecting sampler values", err)


def _fail_if_its_sampler_failed(hooks: EngineHooks, scheduler: Any, reqs: list[Any]) -> None:
    """Fails `reqs`, one step's requests, if that step's sampler call failed. A failure is
    matched to its step by the step's request ids: with overlap the sampler of step t runs
    while the scheduler processes step t - 1, so the next step processed is not the one that
    failed (the batch processed is the one launched, copied: `Scheduler.event_loop_overlap`,
    `result_queue.append((batch.copy(), result))`). A failure of a step without requests
    fails nothing."""
    rids = frozenset(req.rid for req in reqs)
    for entry in list(hooks.failed_samples):
        failed, err = entry
        if failed == rids or not failed:
            hooks.failed_samples.remove(entry)
            if failed:
                _fail_requests(scheduler, reqs, hooks, "an engine step", err)


def _record_before_stream(original, self, reqs, *args, **kwargs):
    """record_before_stream: record new per-token values, finalise finished requests; a
    failure fails these requests, and the output is streamed all the same."""
    hooks = _hooks()
    if hooks is not None:
        try:
            hooks.collector.record(reqs)
        except Exception as err:
            _fail_requests(self, list(reqs), hooks, "recording per-token values", err)
    return original(self, reqs, *args, **kwargs)


def _detokenize(original, self, recv_obj, *args, **kwargs):
    """detokenizer_skips_our_text, then detokenizer_forgets_finished: our requests' ids are cut
    to their last one before upstream decodes them; a finished request's decode state is
    dropped once its last text is made (upstream keeps it until 65,536 requests have passed)."""
    hooks = _hooks()
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


def _typed_sampler_key(original, self, *args, **kwargs):
    """sampler_key_typed: the runner's base sampler key as a typed key of the implementation it
    was made with, before `initialize_jit` captures it."""
    key = self._sampler_base_rng
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        impl = jax.config.jax_default_prng_impl
        self._sampler_base_rng = jax.random.wrap_key_data(key, impl=impl)
    return original(self, *args, **kwargs)


def _scheduler_of_engine(original, self, *args, **kwargs):
    """scheduler_of_engine: tie the scheduler to the engine building it before anything of it
    runs (its watchdog starts inside `__init__`), so a shutdown reaches it from any state."""
    hooks = _hooks()
    self._sgl_jax_rollout_hooks = hooks
    if hooks is not None:
        hooks.scheduler = self
    original(self, *args, **kwargs)


def _runner_of_engine(original, self, *args, **kwargs):
    """runner_of_engine: tie the model runner to the engine building it, so a step still
    queued on the overlap forward thread when the engine stops runs with its own hooks."""
    self._sgl_jax_rollout_hooks = _hooks()
    original(self, *args, **kwargs)


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


def _step_guard(original, self, batch, *args, **kwargs):
    """step_guard: a step that raises on the scheduler thread (our row building, the
    forward without overlap; a failing sampler is handled in `sample_with_slot_state`)
    fails exactly its requests: they are aborted with the error as message, and the step is
    run again with neutral greedy rows (the precompiled sampler) so that upstream finishes
    them and frees their cache as for any abort. If that run raises too, the engine cannot
    go on: the exception reaches upstream's loop handler, whose SIGQUIT `contained_signals`
    turns into an engine fault."""
    hooks = _hooks()
    if hooks is None or hooks.neutral_rows:
        return original(self, batch, *args, **kwargs)
    try:
        return original(self, batch, *args, **kwargs)
    except Exception as err:
        _fail_requests(self, _batch_requests(batch), hooks, "an engine step", err)
    hooks.neutral_rows = True
    try:
        return original(self, batch, *args, **kwargs)
    finally:
        hooks.neutral_rows = False


def _batch_requests(batch: Any) -> list[Any]:
    return [req for req in _requests_by_row(batch) if req is not None]


def _fail_requests(scheduler: Any, reqs: list[Any], hooks: EngineHooks, stage: str, err) -> None:
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


def _watchdog(original, self):
    """watchdog: replaces `Scheduler.watchdog_thread` (not called): the same rule, no step
    finished for `watchdog_timeout` seconds while a batch is current, ends the engine with a
    fault. Upstream's loop never exits (it keeps every shut-down scheduler alive) and then
    SIGQUITs `psutil.Process().parent()`, in single-process mode the process that started
    the trainer."""
    del original
    hooks = self._sgl_jax_rollout_hooks
    if hooks is None:
        return
    timeout = float(self.server_args.watchdog_timeout)
    last_count, last_time = -1, time.perf_counter()
    while not hooks.stop.wait(min(timeout / 4, 5.0)):
        now = time.perf_counter()
        count = getattr(self, "forward_ct", 0)
        if getattr(self, "cur_batch", None) is None or count != last_count:
            last_count, last_time = count, now
        elif now - last_time > timeout:
            hooks.fault(f"no engine step finished in {timeout:.0f}s (watchdog_timeout)")
            return


class _ContainedPsutil:
    """contained_signals: `psutil` as sgl-jax's scheduler, detokenizer and model worker modules
    see it. Their thread handlers end every exception with `Process().send_signal(SIGQUIT)` to
    this process (whose handler upstream kills the whole process tree) or to its parent; here
    that signal becomes a fault of the running engine instead, with the exception being
    handled as its cause. Other signals pass through."""

    def __getattr__(self, name: str) -> Any:
        import psutil

        return getattr(psutil, name)

    def Process(self, *args: Any, **kwargs: Any) -> _ContainedProcess:  # noqa: N802
        import psutil

        return _ContainedProcess(psutil.Process(*args, **kwargs))


class _ContainedProcess:
    def __init__(self, process: Any) -> None:
        self._process = process

    def __getattr__(self, name: str) -> Any:
        return getattr(self._process, name)

    def parent(self) -> _ContainedProcess | None:
        parent = self._process.parent()
        return None if parent is None else _ContainedProcess(parent)

    def send_signal(self, sig: int) -> None:
        if sig != signal.SIGQUIT:
            self._process.send_signal(sig)
            return
        error = sys.exc_info()[1]
        where = threading.current_thread().name
        reason = f"{where}: {type(error).__name__}: {error}" if error else f"{where} failed"
        hooks = _hooks()
        if hooks is None:
            logger.error("an sgl-jax thread failed after its engine stopped: %s", reason)
            return
        hooks.fault(reason, error)


def _whole_calls(original, self, *args, **kwargs):
    """whole_calls: once part of a call's requests has arrived, receive until all of it has
    (`arrivals.py`), so the call starts as one batch."""
    received = original(self, *args, **kwargs)
    hooks = getattr(self, "_sgl_jax_rollout_hooks", None)
    if hooks is None:
        return received
    arrivals = hooks.arrivals
    arrivals.received(_rids(received))
    deadline = time.monotonic() + CALL_ARRIVAL_WAIT_S
    while arrivals.incomplete() and not hooks.stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            logger.warning(
                "part of a call's requests had not reached the scheduler after %.1f s; "
                "scheduling the ones that have",
                CALL_ARRIVAL_WAIT_S,
            )
            break
        if self.recv_from_tokenizer.poll(int(1e3 * min(left, IDLE_WAIT_MS / 1e3)) + 1):
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
    sockets = [getattr(self, n, None) for n in ("recv_from_tokenizer", "recv_from_rpc")]
    poller = zmq.Poller()
    for sock in sockets:
        if sock is not None:
            poller.register(sock, zmq.POLLIN)
    poller.register(hooks.idle_work.fileno(), zmq.POLLIN)
    poller.poll(IDLE_WAIT_MS)
    # Still fully idle: new messages stay in the sockets until the next loop iteration.
    hooks.idle_work.run_pending(self)
    return result
