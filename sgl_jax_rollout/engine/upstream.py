"""The one seam to sgl-jax: every upstream name we call, read or wrap, resolved and checked here.

Checked against sgl-project/sglang-jax `availability.PINNED_COMMIT` (cddbf6f1), each name's
file below (under `python/sgl_jax/srt/`). No other module imports `sgl_jax`: they ask `get(name)`
for a symbol, `module(path)` for a module a patch edits (tests/test_layout.py enforces it).

`check()` runs at engine start (`patches.apply`, before the engine is built) and raises one
RuntimeError naming everything that moved: a symbol that is gone, a wrapped or called
function that lost a parameter we pass, a module global a patch replaces, an attribute we read
on an upstream object (looked up on the class and in the assignments of its source, over its
MRO: instance attributes exist only once built), a keyword `EngineSettings.server_args` passes
that `ServerArgs` lacks, and the pytree layouts our subclasses extend. A release of sgl-jax is
then a diff of this file, and a moved attribute fails at start with its name, never mid-run.
Must not import the trainer side or tunix.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Iterable
from typing import Any

from sgl_jax_rollout.engine.availability import PINNED_COMMIT
from sgl_jax_rollout.engine.source_attributes import class_attributes

ROOT = "sgl_jax.srt"

# Our name -> (module under sgl_jax.srt, attribute). Classes first, then functions and values.
SYMBOLS: dict[str, tuple[str, str]] = {
    "Engine": ("entrypoints.engine", "Engine"),
    "ServerArgs": ("server_args", "ServerArgs"),
    "PortArgs": ("server_args", "PortArgs"),
    "TokenizerManager": ("managers.tokenizer_manager", "TokenizerManager"),
    "Scheduler": ("managers.scheduler", "Scheduler"),
    "DetokenizerManager": ("managers.detokenizer_manager", "DetokenizerManager"),
    "ModelWorker": ("managers.tp_worker", "ModelWorker"),
    "ModelWorkerClient": ("managers.tp_worker_overlap_thread", "ModelWorkerClient"),
    "ModelRunner": ("model_executor.model_runner", "ModelRunner"),
    "Req": ("managers.schedule_batch", "Req"),
    "ScheduleBatch": ("managers.schedule_batch", "ScheduleBatch"),
    "ScheduleReqsInfo": ("managers.schedule_batch", "ScheduleReqsInfo"),
    "ModelWorkerBatch": ("managers.schedule_batch", "ModelWorkerBatch"),
    "SamplingBatchInfo": ("sampling.sampling_batch_info", "SamplingBatchInfo"),
    "SamplingMetadata": ("sampling.sampling_batch_info", "SamplingMetadata"),
    "SamplingParams": ("sampling.sampling_params", "SamplingParams"),
    "LogitsProcessorOutput": ("layers.logits_processor", "LogitsProcessorOutput"),
    "Sampler": ("layers.sampler", "Sampler"),
    "ForwardBatch": ("model_executor.forward_batch_info", "ForwardBatch"),
    "ForwardMode": ("model_executor.forward_batch_info", "ForwardMode"),
    "RadixAttention": ("layers.radix_attention", "RadixAttention"),
    "AttentionType": ("layers.radix_attention", "AttentionType"),
    "NativeAttention": ("layers.attention.native_backend", "NativeAttention"),
    "MHATokenToKVPool": ("mem_cache.memory_pool", "MHATokenToKVPool"),
    "SWAKVPool": ("mem_cache.memory_pool", "SWAKVPool"),
    "KVCache": ("mem_cache.memory_pool", "KVCache"),
    "MemoryPools": ("mem_cache.memory_pool", "MemoryPools"),
    "ReqToTokenPool": ("mem_cache.memory_pool", "ReqToTokenPool"),
    "Llama3RotaryEmbedding": ("layers.embeddings", "Llama3RotaryEmbedding"),
    "ModelConfig": ("configs.model_config", "ModelConfig"),
    "LoRAManager": ("lora.lora_manager", "LoRAManager"),
    "LoRAMemoryPool": ("lora.lora_memory_pool", "LoRAMemoryPool"),
    "BaseLayerWithLoRA": ("lora.layers", "BaseLayerWithLoRA"),
    "LinearBase": ("layers.linear", "LinearBase"),
    "RoutedExpertsCapturerNoop": ("layers.routed_experts_capturer", "_RoutedExpertsCapturerNoop"),
    "GenerateReqInput": ("managers.io_struct", "GenerateReqInput"),
    "AbortReq": ("managers.io_struct", "AbortReq"),
    "PauseGenerationReqInput": ("managers.io_struct", "PauseGenerationReqInput"),  # pausing.py
    "ContinueGenerationReqInput": ("managers.io_struct", "ContinueGenerationReqInput"),
    "BatchTokenIDOut": ("managers.io_struct", "BatchTokenIDOut"),
    "FINISH_ABORT": ("managers.schedule_batch", "FINISH_ABORT"),
    "TOP_K_ALL": ("sampling.sampling_params", "TOP_K_ALL"),
    "forward_attention": ("layers.attention.native_backend", "forward_attention"),
    "merge_kv": ("mem_cache.memory_pool", "merge_kv"),
    "gmm": ("layers.moe", "gmm"),  # patches/upstream_fixes.py experts_matmul_off_tpu
    "is_tpu_runtime": ("kernels.gmm.megablox_gmm_backend", "is_tpu_runtime"),
    "get_global_experts_capturer": (
        "layers.routed_experts_capturer",
        "get_global_experts_capturer",
    ),
    "get_target_module_name": ("lora.utils", "get_target_module_name"),
    "get_available_device_memory": ("utils.jax_utils", "get_available_device_memory"),
    "ModelRegistry": ("models.registry", "ModelRegistry"),  # engine/models/ (ours) join it
    "ModelRegistryClass": ("models.registry", "_ModelRegistry"),
    "Gemma2ForCausalLM": ("models.gemma2", "Gemma2ForCausalLM"),
    "Gemma2Model": ("models.gemma2", "Gemma2Model"),
    "Gemma2DecoderLayer": ("models.gemma2", "Gemma2DecoderLayer"),
    "Gemma2MLP": ("models.gemma2", "Gemma2MLP"),
    "GemmaRMSNorm": ("layers.layernorm", "GemmaRMSNorm"),
    "GateLogit": ("layers.gate", "GateLogit"),  # and EPMoE: patches/agreement.py router_in_dtype
    "EPMoE": ("layers.moe", "EPMoE"),
    "RMSNorm": ("layers.layernorm", "RMSNorm"),  # patches/agreement.py rms_norm_order
    "RotaryEmbedding": ("layers.embeddings", "RotaryEmbedding"),
    "apply_rotary_emb": ("layers.embeddings", "apply_rotary_emb"),  # patches/agreement.py
    # rotary embeddings, cached per process (patches/agreement.py: no rule stored on them)
    "get_rope": ("layers.embeddings", "get_rope"),
    "Embed": ("layers.embeddings", "Embed"),
    "LogitsProcessor": ("layers.logits_processor", "LogitsProcessor"),
    "WeightMapping": ("utils.weight_utils", "WeightMapping"),
}

# Functions we wrap or call, and the parameters we pass or rely on ("Class.method" or a symbol).
FUNCTIONS: dict[str, tuple[str, ...]] = {
    # wrapped (patches/)
    "ScheduleBatch.get_model_worker_batch": ("self", "token_paddings", "bs_paddings"),
    "ScheduleBatch._merge_cache_loc": (
        *("self", "bs_paddings", "cache_loc_paddings", "page_size", "per_dp_bs_size"),
    ),
    "SamplingMetadata.from_model_worker_batch": ("batch", "pad_size", "mesh", "vocab_size"),
    "Scheduler.process_batch_result": ("self", "batch", "result"),
    "Scheduler.stream_output": ("self", "reqs", "return_logprob"),
    "Scheduler.on_idle": ("self",),
    "Scheduler.process_input_requests": ("self", "recv_reqs"),
    "Scheduler.recv_requests": ("self",),
    "Scheduler.get_new_batch_prefill": ("self",),
    "Scheduler.update_running_batch": ("self", "batch"),
    "Scheduler.__init__": ("self", "server_args", "port_args"),
    "Scheduler.run_batch": ("self", "batch"),
    "Scheduler.watchdog_thread": ("self",),
    "Scheduler._get_token_info": ("self",),  # load.py
    "DetokenizerManager.handle_batch_token_id_out": ("self", "recv_obj"),
    "ModelWorker.__init__": ("self",),
    "ModelWorker.run_precompile": ("self",),
    "ModelWorker._materialize_logprobs_to_host": (
        *("self", "logits_output", "model_worker_batch", "selector"),
    ),
    "ModelRunner.sample": ("self", "logits_output", "sampling_metadata"),
    "ModelRunner.initialize_jit": ("self",),
    "ModelRunner.get_available_device_memory": ("self",),
    "ModelRunner.init_memory_pool": ("self",),
    "ModelRunner.init_attention_backend": ("self",),
    "ModelRunner.__init__": ("self",),
    "LoRAManager.__init__": ("self", "base_hf_config", "model_config"),
    "LoRAManager.init_memory_pool": ("self",),
    "ModelWorkerClient.resolve_last_batch_result": ("self", "launch_done"),
    "Llama3RotaryEmbedding.__init__": (
        *("self", "head_size", "rotary_dim", "max_position_embeddings", "base"),
        "scaling_factor",
    ),
    "RotaryEmbedding._compute_cos_sin": ("self", "positions"),
    "RotaryEmbedding.__call__": ("self", "positions", "query", "key"),
    "apply_rotary_emb": ("x", "cos", "sin", "is_neox_style"),
    "RMSNorm.__call__": ("self", "x", "mask"),
    "GemmaRMSNorm.__call__": ("self", "x", "residual"),
    "GateLogit.__call__": ("self", "hidden_states"),
    "EPMoE.__call__": ("self", "hidden_states", "topk_weights", "topk_ids"),
    "NativeAttention.__call__": (
        *("self", "q", "k", "v", "layer", "forward_batch", "token_to_kv_pool"),
    ),
    # replaced (patches/sampler_hooks.py sampler_class: RolloutSampler keeps this call)
    "Sampler.__call__": ("self", "logits_output", "sampling_metadata", "rng_override"),
    # called
    "Llama3RotaryEmbedding._compute_inv_freq": ("self", "base"),
    "Scheduler.abort_request": ("self", "recv_req"),
    "Scheduler.flush_cache": ("self",),
    "Scheduler.is_fully_idle": ("self",),
    "ScheduleBatch.filter_batch": ("self", "keep_indices"),
    "Engine.abort_request": ("self", "rid", "abort_all"),
    "TokenizerManager.generate_request": ("self", "obj", "request"),
    "TokenizerManager.abort_request": ("self", "rid", "abort_all"),
    "TokenizerManager.pause_generation": ("self", "obj"),
    "TokenizerManager.continue_generation": ("self", "obj"),
    "Req.finished": ("self",),
    "ForwardMode.is_extend": ("self",),
    "ForwardMode.is_decode": ("self",),
    "MHATokenToKVPool.get_fused_kv_buffer": ("self", "layer_id"),
    "SWAKVPool.get_fused_kv_buffer": ("self", "layer_id"),
    "MHATokenToKVPool.set_kv_buffer_legacy": ("self", "layer_id", "loc", "cache_k", "cache_v"),
    "SWAKVPool.tree_flatten": ("self",),
    "forward_attention": (
        *("q", "k_cache", "v_cache", "seq_lengths", "loc", "extend_prefix_lens"),
        *("extend_seq_lens", "num_heads", "num_kv_heads", "scale", "is_causal", "mode"),
        *("kv_sharding", "mesh", "xai_temperature_len", "sliding_window_size", "softmax_dtype"),
    ),
    "merge_kv": ("k", "v"),
    "gmm": (
        *("lhs", "rhs", "group_sizes", "preferred_element_type", "group_offset", "interpret"),
        *("rhs_scale", "rhs_bias", "existing_out", "activation_quantized_dtype", "tiling"),
    ),
    "get_global_experts_capturer": (),
    "get_target_module_name": ("full_module_name", "target_modules"),
    "get_available_device_memory": ("device", "distributed", "device_indexes"),
    "AbortReq": ("rid",),
    "PauseGenerationReqInput": ("mode",),
    "FINISH_ABORT": ("message",),
    # built on (engine/models/gemma3.py): the layers it makes and the Gemma 2 code it inherits
    "Gemma2ForCausalLM._create_layer_mappings": ("self", "layer_idx"),
    "Gemma2ForCausalLM.load_weights": ("self", "model_config"),
    "Gemma2MLP.__init__": ("self", "hidden_size", "intermediate_size", "mesh", "layer_id", "dtype"),
    "GemmaRMSNorm.__init__": ("self", "hidden_size", "epsilon"),
    "RotaryEmbedding.__init__": (
        *("self", "head_size", "rotary_dim", "max_position_embeddings", "base"),
        *("is_neox_style", "dtype"),
    ),
    "RotaryEmbedding._compute_inv_freq": ("self", "base"),
    "Embed.__init__": (
        *("self", "num_embeddings", "features", "dtype", "param_dtype", "kernel_axes", "mesh"),
    ),
    "LinearBase.__init__": (
        *("self", "input_size", "output_size", "mesh", "use_bias", "params_dtype"),
        "kernel_axes",
    ),
    "RadixAttention.__init__": (
        *("self", "num_heads", "head_dim", "scaling", "num_kv_heads", "layer_id"),
        "sliding_window_size",
    ),
    "LogitsProcessor.__init__": ("self", "vocab_size", "mesh", "soft_cap"),
    "WeightMapping": ("target_path", "sharding", "transpose"),
}

# Attributes we read (or write) on upstream objects, by class.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "Engine": ("scheduler_info", "tokenizer_manager", "loop", "port_args"),
    "PortArgs": ("detokenizer_ipc_name",),
    "ServerArgs": ("watchdog_timeout",),
    "Scheduler": (
        *("tp_worker", "enable_overlap", "server_args", "forward_ct", "cur_batch"),
        *("recv_from_tokenizer", "recv_from_rpc", "running_batch", "waiting_queue"),
        *("result_queue", "max_total_num_tokens", "_engine_paused"),
    ),
    "ModelWorker": ("worker", "model_runner", "sync_queue"),
    "ModelWorkerClient": ("worker", "input_queue", "forward_thread", "async_gather_fn"),
    "ModelRunner": (
        *("model", "model_state_leaves", "model_config", "mesh", "req_to_token_pool"),
        *("_sampler_base_rng", "forward", "sample", "memory_pools", "attn_backend"),
        *("device", "server_args"),
    ),
    # memory.py (release / resume): the per-layer KV buffer lists, in place
    "MemoryPools": ("_pools",),
    "MHATokenToKVPool": ("kv_buffer",),
    "SWAKVPool": ("swa_kv_pool", "full_kv_pool", "layers_mapping", "full_to_swa_index_mapping"),
    "KVCache": ("mesh", "start_layer"),
    "ReqToTokenPool": ("size",),
    "DetokenizerManager": ("decode_status",),
    "BatchTokenIDOut": ("rids", "finished_reasons", "decode_ids"),
    "Req": (
        *("rid", "origin_input_ids", "output_ids", "output_ids_through_stop", "req_pool_idx"),
        *("sampling_params", "finished_reason", "to_finish", "routed_experts"),
    ),
    "GenerateReqInput": ("return_routed_experts",),
    "ScheduleBatch": ("reqs_info", "per_dp_bs_size", "forward_mode", "is_empty", "batch_size"),
    "ScheduleReqsInfo": ("reqs", "batch_is_full"),
    "ModelWorkerBatch": ("sampling_info", "return_logprob", "return_output_logprob_only"),
    "SamplingBatchInfo": ("temperatures",),
    "SamplingParams": (
        *("temperature", "top_k", "top_p", "min_p", "sampling_seed", "max_new_tokens"),
    ),
    "ForwardBatch": (
        *("forward_mode", "seq_lens", "extend_prefix_lens", "extend_seq_lens"),
        *("out_cache_loc", "cache_loc"),
    ),
    "RadixAttention": (
        *("head_dim", "attn_type", "scaling", "sliding_window_size", "softmax_dtype"),
        *("layer_id", "logit_cap"),
    ),
    "NativeAttention": ("mesh",),
    # patches/upstream_fixes.py lora_buffers_per_layer
    "LoRAManager": ("memory_pool", "lora_modules"),
    "LoRAMemoryPool": (
        *("A_buffer", "B_buffer", "target_modules", "max_loras_per_batch", "max_lora_rank"),
    ),
    "ModelConfig": ("hf_text_config", "model_path"),  # lora_text_config; Gemma 3's prefix
    "BaseLayerWithLoRA": ("base_layer",),
    "LinearBase": ("weight",),
    "Llama3RotaryEmbedding": ("base", "_inv_freq_np"),
    "ForwardMode": ("DECODE",),
    "AttentionType": ("ENCODER_ONLY",),
    # engine/models/gemma3.py: what the inherited Gemma 2 code reads; the registry we extend
    "Gemma2ForCausalLM": ("mesh", "config", "dtype", "model", "logits_processor"),
    "Gemma2Model": ("embed_tokens", "layers", "norm", "hidden_size"),
    "Gemma2DecoderLayer": (
        *("layer_id", "self_attn", "mlp", "input_layernorm", "post_attention_layernorm"),
        *("pre_feedforward_layernorm", "post_feedforward_layernorm"),
    ),
    "RotaryEmbedding": ("_inv_freq_np", "rotary_dim", "base", "head_size", "is_neox_style"),
    "RMSNorm": ("scale", "epsilon", "dtype", "reduction_axes"),
    "GemmaRMSNorm": ("weight", "epsilon", "add_unit_offset"),
    "GateLogit": ("kernel", "bias", "score_func"),
    "ModelRegistryClass": ("models",),
}

# Module globals a patch replaces (patches/: sampler_class, scheduler_faulthandler,
# engine_sockets, contained_signals, attention_logit_cap).
MODULE_GLOBALS: dict[str, tuple[str, ...]] = {
    "model_executor.model_runner": ("Sampler",),
    "managers.scheduler": ("faulthandler", "get_zmq_socket", "psutil"),
    "managers.detokenizer_manager": ("get_zmq_socket", "psutil"),
    "managers.tokenizer_manager": ("get_zmq_socket",),
    "managers.tp_worker": ("psutil",),
    "managers.tp_worker_overlap_thread": ("psutil",),
    "layers.attention.native_backend": ("forward_attention", "jnp"),
    "layers.moe": ("gmm",),
    "entrypoints.engine": ("get_zmq_socket",),
}
SOCKET_MODULES = tuple(m for m, names in MODULE_GLOBALS.items() if "get_zmq_socket" in names)
SIGNALLING_MODULES = tuple(m for m, names in MODULE_GLOBALS.items() if "psutil" in names)

# The pytrees our subclasses extend (engine/sampler_module.py): children in this order.
STOCK_OUTPUT_CHILDREN = 12  # LogitsProcessorOutput
STOCK_METADATA_CHILDREN = 12  # SamplingMetadata: these children + 3 aux fields
SCHEDULER_INFO_KEY = "scheduler"  # Engine.scheduler_info[...] in single-process mode


def module(path: str) -> Any:
    """The upstream module `sgl_jax.srt.<path>` (ModuleNotFoundError without the engine;
    entry points run `availability.require_sgl_jax` first, which says how to install it)."""
    return importlib.import_module(f"{ROOT}.{path}")


def get(name: str) -> Any:
    """The upstream object we call `name` (a key of SYMBOLS)."""
    path, attr = SYMBOLS[name]
    return getattr(module(path), attr)


def scheduler_of(engine: Any) -> Any:
    """The scheduler a single-process engine built (`Engine.scheduler_info`)."""
    info = engine.scheduler_info
    if SCHEDULER_INFO_KEY not in info:
        raise RuntimeError(
            f"sgl-jax's Engine.scheduler_info has no {SCHEDULER_INFO_KEY!r} entry (keys: "
            f"{sorted(info)}); checked against {PINNED_COMMIT}"
        )
    return info[SCHEDULER_INFO_KEY]


def model_runner_of(scheduler: Any) -> Any:
    """The scheduler's model runner, with or without the overlap worker thread."""
    return scheduler.tp_worker.worker.model_runner


def check(server_args: Iterable[str] = ()) -> None:
    """Raises RuntimeError naming every upstream name that moved; `server_args` are the
    keywords we give `Engine` (checked against `ServerArgs`' fields)."""
    problems: list[str] = []
    objects: dict[str, Any] = {}
    for name in SYMBOLS:
        try:
            objects[name] = get(name)
        except (ImportError, AttributeError) as err:
            path, attr = SYMBOLS[name]
            problems.append(f"{ROOT}.{path}.{attr} is gone ({type(err).__name__}: {err})")
    for name, params in FUNCTIONS.items():
        problems += _function_problems(name, params, objects)
    for cls_name, attrs in ATTRIBUTES.items():
        if cls_name in objects:
            known = class_attributes(objects[cls_name])
            lost = [a for a in attrs if a not in known]
            if lost:
                problems.append(f"{cls_name} no longer has attribute(s) {lost}")
    for path, names in MODULE_GLOBALS.items():
        lost = [n for n in names if not hasattr(module(path), n)]
        if lost:
            problems.append(f"{ROOT}.{path} no longer has {lost}")
    if "ServerArgs" in objects:
        fields = {f.name for f in dataclasses.fields(objects["ServerArgs"])}
        unknown = sorted(set(server_args) - fields)
        if unknown:
            problems.append(f"ServerArgs has no field(s) {unknown}")
    problems += _pytree_problems(objects)
    if problems:
        raise RuntimeError(
            f"sgl-jax differs from the commit our patches were checked against "
            f"({PINNED_COMMIT}): " + "; ".join(problems)
        )


def _function_problems(name: str, params: tuple[str, ...], objects: dict[str, Any]) -> list[str]:
    owner, _, attr = name.partition(".")
    if owner not in objects:
        return []  # reported as a missing symbol
    fn = getattr(objects[owner], attr, None) if attr else objects[owner]
    if fn is None:
        return [f"{name} is gone"]
    fn = getattr(fn, "__wrapped__", fn)
    try:
        found = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return [f"{name} has no readable signature"]
    missing = [p for p in params if p not in found]
    return [f"{name} lost parameter(s) {missing} (has {found})"] if missing else []


def _pytree_problems(objects: dict[str, Any]) -> list[str]:
    problems = []
    output = objects.get("LogitsProcessorOutput")
    if output is not None:
        children = output(next_token_logits=None).tree_flatten()[0]
        if len(children) != STOCK_OUTPUT_CHILDREN:
            problems.append(
                f"LogitsProcessorOutput has {len(children)} pytree children, not "
                f"{STOCK_OUTPUT_CHILDREN}"
            )
    metadata = objects.get("SamplingMetadata")
    if metadata is not None:
        fields = [f.name for f in dataclasses.fields(metadata)]
        if len(fields) != STOCK_METADATA_CHILDREN + 3:
            problems.append(f"SamplingMetadata fields changed: {fields}")
    return problems
