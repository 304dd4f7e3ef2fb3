"""Every change we make to sgl-jax internals: the catalog, and `apply`.

Checked against sgl-project/sglang-jax commit cddbf6f1cc33cbdd453bd8f36ff7051cf46ca176
(`python/sgl_jax/srt/...`). Each patch is named, wraps (never copies) the upstream function,
and is applied once per process (`apply`, which installs each module's patches). Every
upstream name reaches us through `upstream.py`, whose `check` (run by `apply`, at engine
start) fails loudly, naming it, when a name, parameter or attribute we rely on changes.
Overlap scheduling works as upstream runs it: what the sampler needs of a request's output
(tokens generated, penalty tables) lives on the device per request slot (`slot_state.py`),
never read from the host's lagging output ids.

The patches come in seven kinds, one module each (below); `hooks.py` holds what they share.
Containment (docs/design.md section 8): no fault on an engine thread may take the trainer's
process down. `step_guard` keeps a failing step to its own requests; `contained_signals`
and `watchdog` turn upstream's last resort, SIGQUIT to this process (or its parent), into an
engine fault that ends the engine alone; our scheduler-side hooks fail their requests
instead of raising.

## Sampler hooks (`sampler_hooks.py`): our sampler in upstream's step, rows in, values out

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

## Scheduling fixes (`scheduling.py`): no model step or host work spent for nothing

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
- `detokenizer_forgets_finished`: wraps `DetokenizerManager.handle_batch_token_id_out` to drop
  a finished request's decode state (its token ids and text). Upstream keeps every request's
  state until `SGLANG_DETOKENIZER_MAX_STATES` (65,536) requests have passed
  (`detokenizer_manager.py:36, 85, 316`): host memory that grows with every completion of an RL
  run, tens of KB per 1k-token completion, gigabytes at the cap. The count left after each
  batch is reported by `RolloutEngine.store_sizes()` as `detokenizer_states`.

## Fault containment (`containment.py`)

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

## Upstream bug fixes (`upstream_fixes.py`): each to drop when sgl-jax fixes it

- `llama3_rope_scaling`: wraps `layers.embeddings.Llama3RotaryEmbedding.__init__` so the
  rotary phases use the llama3-scaled frequencies. Upstream's base class computes
  `_inv_freq_np` (what `_compute_cos_sin` reads) unscaled in its `__init__`, and the llama3
  subclass only overrides `_compute_inv_freq`, which nothing on that path calls: every Llama
  3.1 / 3.2 checkpoint (rope_scaling "llama3") is served with unscaled RoPE, another function
  than the checkpoint's (0.2 nats at positions past 1,024 on a tiny replica).
- `paged_native_attention`: wraps `NativeAttention.__call__` (the attention sgl-jax runs on CPU and
  GPU) and `ModelRunner.init_attention_backend`: for an engine whose `native_attention` is "paged"
  (the default) the backend is marked `paged` (static), and each layer runs
  `native_attention.paged_native_attention` (`paged_attention.py`): the KV write a scatter into the
  donated buffer, then each request's queries over its own slots, per dp rank and tensor shard under
  `shard_map`. An upstream performance and correctness fix: `forward_attention` attends every query
  to every slot of the batch's `cache_loc` (the largest batch bucket's worth of requests in an
  extend) and masks the product (`native_backend.py:221-327`); it repeats the KV heads for GQA and
  copies the layer's whole buffer to split K from V (`native_backend.py:150-157`); and it finds each
  request's slots at `cumsum(seq_lens)` while `_merge_cache_loc` starts each at a page boundary
  (`schedule_batch.py:2428-2431`), so with pages over one token every request but the first read
  other slots. Everything the upstream path below serves is served: GQA, windows and the hybrid
  pool, soft-caps, sinks, head_dim padding, tp and dp. "upstream" keeps sgl-jax's own, with the
  fixes below, to compare with (`bench attention`).
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
- `attention_logit_cap`: in the same wrapper, a layer's `logit_cap` (Gemma 2's
  `attn_logit_softcapping`, 50) reaches the CPU attention. An upstream bug fix: the TPU
  kernel soft-caps the scores (`flashattention_backend.py:723`, `soft_cap=layer.logit_cap`),
  the native backend never reads `logit_cap` (`native_backend.py:73-113, 169-327`), so on
  CPU Gemma 2 was served without its attention soft-cap. `forward_attention` takes no cap, so
  the module's `jnp` is replaced by `_ScoreCappingNumpy`, which soft-caps the one score
  einsum (`"qhd,khd->qhk"`, `native_backend.py:256`) while a capped layer is traced:
  `cap * tanh(s * scale / cap) / scale`, which upstream then multiplies by `scale`.
- `native_attention_per_rank`: wraps `NativeAttention.__call__` (the attention sgl-jax uses
  on CPU) so that with dp > 1 each dp rank attends over its own batch section and KV shard
  (`dp_attention.py`). An upstream bug fix: `NativeAttention.__call__` and
  `_get_and_update_kv_cache` (`layers/attention/native_backend.py`) treat a dp > 1 batch as one
  global batch, and `set_kv_buffer_legacy` (`mem_cache/memory_pool.py:716`) writes rank 1's
  keys over rank 0's slots. One dp rank: upstream runs unchanged.
- `swa_pool_native_attention`: in the same wrapper, and `SWAKVPool.set_kv_buffer_legacy`
  added: the CPU attention serves upstream's hybrid pool (one sub-pool for the sliding-window
  layers, one for the full ones), which a model whose two kinds of layer keep KV of different
  shapes needs (Gemma 4: head_dim 256 / 512; one pool fails at start with a broadcast error).
  An upstream bug fix: the native backend writes through `set_kv_buffer_legacy`
  (`native_backend.py:143`), which `SWAKVPool` lacks (`memory_pool.py:768`), and reads a
  windowed layer at its full-pool slots (`cache_loc`) where the TPU backend remaps them to the
  window pool's (`flashattention_backend.py:646-647`). The write goes to the layer's sub-pool
  at the slots upstream's `set_kv_buffer` would use; the read's `cache_loc` is remapped with
  upstream's mapping, replicated on the mesh (indexed as upstream does, it fails beside the
  explicit mesh's sharded slots). Other models keep one pool on CPU (`EngineSettings`).
- `swa_mapping_copied`: wraps `SWAKVPool.tree_flatten` so that on CPU a forward gets a copy of
  the host's full-to-window slot mapping, which upstream flattens into every forward's
  arguments (`memory_pool.py:825-838`) while its allocator keeps writing it
  (`allocator.py:468`): the aliasing `cache_loc_copied` describes, for the mapping.
- `swa_mapping_not_static`: wraps `ModelRunner.init_memory_pool` to take back the slot mapping
  upstream hands the attention backend for its flash kernel
  (`model_runner_kv_cache_mixin.py:823-828`) when the backend is the native one, which never
  reads it: the native backend is an nnx pytree, so the numpy array became static metadata of
  every forward's arguments, and a second engine with a hybrid pool in the same process failed
  at its first step (JAX compares cached calls' metadata; two arrays have no truth value).
- `lora_text_config`: wraps `LoRAManager.__init__` so the LoRA manager reads the language
  model's config (`ModelConfig.hf_text_config`). Upstream hands it the checkpoint's top-level
  config (`model_runner.py:1031-1033`) and reads layers, hidden size and heads at its top
  (`lora_manager.py:103-112`), which Gemma 4 nests under `text_config`: a LoRA engine failed
  at start.
- `lora_buffers_per_layer`: wraps `LoRAManager.init_memory_pool` so each layer's LoRA buffers
  have the shape of the kernel they adapt. Upstream sizes every layer's from one head_dim and
  KV head count (`lora_memory_pool.py:232-294`), while Gemma 4's full layers have twice the
  head_dim and a quarter of the KV heads: their adapters could not be added.
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
- `scheduler_faulthandler`: the `faulthandler` that `managers.scheduler` calls at the start of
  its thread (`scheduler_loop_after_create`, `scheduler.py:3027`, outside its try) enables on
  the process's real stderr where `sys.stderr` has no file descriptor (Jupyter, pytest's
  capture). Upstream's bare `faulthandler.enable()` raises `io.UnsupportedOperation` there,
  the scheduler thread dies before its loop, and every call then waits for a step that never
  comes.
- `sampler_key_typed`: wraps `ModelRunner.initialize_jit`. Upstream keeps its sampler's base
  key as raw `PRNGKey` data (`model_runner.py:175`) and folds the step into it inside the
  jitted sampler (`:296`), which reads raw data with whatever `jax_default_prng_impl` is set
  when a sampler config is traced: a trainer that changes it (to rbg, unsafe_rbg) after the
  engine started fails every new trace. A typed key carries its implementation.

- `cpu_memory_balance`: wraps `ModelRunner.get_available_device_memory` so that on the CPU
  device the engine sizes itself by the minimum free memory over every process (upstream's own
  `get_available_device_memory`), without upstream's tensor-parallel balance check
  (`model_runner.py:477-498`). On CPU each process reads the host's free RAM
  (`jax_utils.py:192-197`) at its own moment, so two processes sharing a host (`launch`, the
  simulated hosts) failed their start at random whenever one allocated between the reads
  ("The memory capacity is unbalanced": 11.1 GB against 13.1 GB, seen in CI). Other devices
  keep the check.
- `experts_matmul_off_tpu`: wraps `layers.moe.gmm` (the MoE layer's three grouped matmuls a
  layer) so that where upstream would run its megablox Pallas kernel in interpret mode (off
  TPU: `kernels/gmm/megablox_gmm_backend.py:58-59`), the product is `grouped_matmul.py`'s
  (a loop over the (row tile, expert) pairs that hold rows: the same rows times the same
  experts, float32 accumulation). The interpreted kernel is the debugging path, a loop of
  small ops over its grid: on CPU at Qwen3-30B-A3B's expert shapes 1,693 against 30 ms a
  product at a 4,096-token prefill, 71 against 1.7 ms at a decode step of 4, 2 to 5 s against
  0.5 s to compile each product; a MoE's generate spent most of its time there. Experts with
  scales, bias or quantized activations keep upstream's kernel; TPU keeps it everywhere.

## Trainer agreement (`agreement.py`): sgl-jax's numbers rounded as the trainer rounds them

- `rope_phases`: wraps `layers.embeddings.RotaryEmbedding._compute_cos_sin`
  (`layers/embeddings.py:251-255`: position times inverse frequencies computed in numpy): a
  plain rotary embedding (the base class, or Gemma 3's linear scaling) run by an engine whose
  `rope_phases` setting is "trainer" (the default) computes its phases as tunix's model of
  the checkpoint's `model_type` does (`engine/rope_phases.py`: position divided by
  `base ** (2i / d)` evaluated by XLA; times its reciprocal for qwen2), bit for bit the
  trainer's. The rule is the running engine's, read at each trace, never stored on the
  embedding: sgl-jax's `get_rope` hands every engine of a process the same cached one
  (`_ROPE_DICT`, `layers/embeddings.py:601-647`). Upstream's numpy frequencies differ in the
  last bit of about half the phases; on Gemma 3 270M at 1,000-token prompts the rollout's
  logprobs were up to 1.6e-4 from the trainer's with them, 9.6e-5 with the trainer's
  (2026-11-30; since 83ca19c's extend, 8.3e-5 / 7.8e-5 at T = 1 and 9.0e-5 / 1.34e-4 at
  T = 0.7: the float32 sums' rounding decides as much there, docs/guide.md).
  Subclasses with frequencies of their own (llama3 scaling, YaRN, Gemma 4's proportional
  RoPE) keep upstream's.
- `rms_norm_order`: wraps `layers.layernorm.RMSNorm.__call__` (`x * (rsqrt(ms + eps) * w)` in
  float32, `layernorm.py:171-184`): a bfloat16 norm with a weight, of an engine whose `numerics`
  is "trainer" (the default), computes in the op order of tunix's model of the checkpoint
  (`engine/numerics.py`: `w * (x / rms)` for Qwen2 / 3), bit for bit tunix's norm. Llama's
  (`(w * x) / rms`, the product in bfloat16) measured worse in the whole model and is not
  applied (`numerics.py`); float32 norms stay upstream's.
- `gemma_norm_in_dtype`: wraps `layers.layernorm.GemmaRMSNorm.__call__` (float32 throughout,
  rounded once): under the same setting a bfloat16 `x * (1 + w)` norm of Gemma 2 / 3 computes
  every step in bfloat16 after upstream's residual add, as tunix's Gemma 2 / 3 `RMSNorm` does
  (`models/gemma{,3}/model.py`), bit for bit. Gemma 4's norms (tunix computes them in float32)
  and float32 norms stay upstream's.
- `rounded_attention_weights` (in `paged_native_attention`'s wrapper, `upstream_fixes.py`): under
  the same setting, a bfloat16 layer of Qwen2 / 3, Llama or Gemma 4 normalises its attention
  weights in float32 and rounds each to bfloat16 before the value product, as tunix's attention
  does (`softmax(...).astype(dtype)`; `ScoreOptions.round_weights`), where upstream's
  and the paged attention's online softmax keep them unnormalised in float32 and divide once:
  a second pass over the keys. Gemma 2 / 3 layers instead take the whole softmax in
  bfloat16 as tunix's do (`jax.nn.softmax` on bfloat16 scores; `ScoreOptions.softmax_in`):
  three passes over the keys. The TPU kernel and the "upstream" native attention are not
  changed. On a bfloat16 Qwen3-0.6B replica the two patches together took the engine's mean
  logprob gap to tunix's bfloat16 trainer from 0.0119 to 0.0007 with XLA's excess precision
  off (`numerics.py`), from 0.0149 to 0.0102 with it on.
- `router_in_dtype` (`patches/agreement.py`): wraps `layers.gate.GateLogit.__call__` (router
  logits a float32 product, softmax in float32) and `layers.moe.EPMoE.__call__` (experts
  weighed in float32): under the same setting a bfloat16 Qwen3-MoE takes its router logits in
  bfloat16 before the float32 softmax, and rounds its routing weights to bfloat16 before they
  weigh the experts' outputs, as tunix's `MoELayer` does (`models/qwen3/model.py`), bit for
  bit. The fused TPU experts (`FusedEPMoE`) are not changed.
- `rope_in_float32` (`patches/agreement.py`): wraps `layers.embeddings.RotaryEmbedding.__call__`
  (cos and sin rounded to the activation dtype, then the rotation): under the same setting a
  bfloat16 Llama or Gemma 2 / 3 rotates query and key in float32 by float32 cos and sin and
  rounds once, as tunix's `apply_rope` of those models does, bit for bit.

## Models (`models.py`): architectures sgl-jax lacks, registered

- `gemma3_text`: `Gemma3ForCausalLM` (`engine/models/gemma3.py`, Gemma 3's text model built
  on sgl-jax's Gemma 2: q / k norms, a RoPE base per layer kind with the full layers' linear
  scaling, windowed and full layers by `layer_types`) added to `ModelRegistry.models`
  (`models/registry.py`), and `Gemma3ForConditionalGeneration`, the same model on a
  multimodal checkpoint's `text_config` (4B and up; weights under `language_model.model.` or
  `model.language_model.`, the vision tower not loaded); sgl-jax at cddbf6f1 has `gemma2.py`
  and `gemma4.py` only, and a Gemma 3 checkpoint failed at start ("not supported"). To drop
  when upstream ships its own with the same HF weight names:
  `test_gemma3_is_registered_for_the_engine` then finds a name registered before `install`.

## Lifecycle (`lifecycle.py`)

- `scheduler_of_engine`: wraps `Scheduler.__init__` to tie the scheduler to the engine that
  builds it before any of it runs, so a shutdown reaches it from any state of a start.
- `runner_of_engine`: wraps `ModelRunner.__init__` the same way for the model runner: with
  overlap, a step already queued on the forward thread when the engine stops still runs its
  sampler with that engine's slot state (the process may hold no active engine by then).
- `engine_sockets`: wraps `get_zmq_socket` where the engine's components import it
  (`entrypoints.engine`, `managers.scheduler`, `managers.tokenizer_manager`,
  `managers.detokenizer_manager`): every engine socket gets `LINGER` 0 and is recorded in the
  running engine's hooks, so shutdown closes all of them. Upstream never closes the
  detokenizer's sockets; when the garbage collector later finalises that shut-down engine's
  zmq context, the sockets' weak references are already cleared, `Context.term` waits for
  sockets nobody will close, and the thread that happened to run the collection hangs forever
  (seen as a full test run stuck inside a jit trace).
- `idle_wait_and_stop`: wraps `Scheduler.on_idle`: a fully idle scheduler runs the engine's
  `IdleWork` (weight swap, cache flush), then waits on its sockets and on the work pipe
  (upstream spins a core at 100%), and exits its thread when the engine is shut down.
- `paused_waits`: wraps `Scheduler.process_input_requests`: a scheduler paused in place
  (`pause_generation(mode="in_place")`, `engine.pausing`) skips `on_idle` in its loop
  (`scheduler.py:1076-1078` at cddbf6f1), so it spun a core at 100% while paused and never
  left its loop on shutdown; it now waits on its sockets, and exits on shutdown.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.patches import (
    agreement,
    containment,
    lifecycle,
    models,
    sampler_hooks,
    scheduling,
    upstream_fixes,
)
from sgl_jax_rollout.engine.patches.hooks import EngineHooks, activate, current, deactivate

__all__ = ["EngineHooks", "activate", "apply", "current", "deactivate"]

_APPLY_LOCK = threading.Lock()


def apply(server_args: Iterable[str] = ()) -> None:
    """Checks sgl-jax against the names we rely on (`upstream.check`, with the `Engine`
    keywords `server_args`), then installs every patch once per process (idempotent)."""
    with _APPLY_LOCK:
        upstream.check(server_args)
        for kind in (
            sampler_hooks,
            scheduling,
            containment,
            upstream_fixes,
            agreement,
            models,
            lifecycle,
        ):
            kind.install()
