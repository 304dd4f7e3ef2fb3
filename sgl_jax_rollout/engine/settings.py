"""Engine settings: what a user may choose about the in-process sgl-jax engine.

Owns `EngineSettings`, validated at construction (errors name the field and its range), and
its translation to sgl-jax `ServerArgs` keywords. Settings the rollout depends on are forced
there, not offered: single-process mode (the engine must share the trainer's process), mixed
chunks off (slot state joins from prefill batches only), the engine-loop daemon (requests are
submitted from any thread) and no server warm-up.

No sgl_jax import: settings are checked before anything starts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from sgl_jax_rollout.utils.model_dir import language_config

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("fa", "native", "fa_mha")
NATIVE_ATTENTIONS = ("paged", "upstream")
ROPE_PHASES = ("trainer", "sgl-jax")
NUMERICS = ("trainer", "sgl-jax")
SWITCHES = (
    "overlap_schedule",
    "vocab_parallel_sampler",
    "return_routed_experts",
    "share_group_prefill",
)
FORCED = {
    "enable_single_process": True,
    # Mixed chunks put decode rows in extend batches: they would join their slot from output
    # ids that lag a token under overlap (slot_state.py). Upstream's default, made certain.
    "enable_mixed_chunk": False,
    "enable_engine_loop_run_forever_daemon": True,
    "skip_server_warmup": True,
}


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """Settings of the in-process engine (sgl-jax `ServerArgs` names where they exist).

    Exactly one of `mem_fraction_static` and `max_total_tokens` sizes the KV cache.
    `tp_size` is the total number of devices; the mesh is `[dp_size, tp_size // dp_size]`.
    `extra` passes further `ServerArgs` keywords through (not the forced ones).
    `sampler_modes` lists sampler modes to compile at start besides those the rollout derives
    from its defaults: each a dict of `SamplingOptions` output fields (`logprobs_mode`,
    `entropy_source`, `entropy_top_k`, `return_logprobs`, `return_entropy`, `top_logprobs`)
    and `penalties` (bool), e.g. `{"entropy_top_k": 64}`; unnamed fields take their defaults,
    except `return_logprobs`: unnamed, both (`RolloutConfig.return_logprobs` picks per call).
    Penalty modes compile at the smallest id-table widths only (wider prompts still compile
    once per width bucket, at their prefill). `overlap_schedule` is sgl-jax's overlap
    scheduler (the host prepares step t + 1 while the device runs step t): on by default, as
    upstream runs; False turns it off (same results, the host's work then waits for each step).
    `vocab_parallel_sampler` (default True): with more than one device on the tensor axis,
    the sampler runs on each device's columns of the vocabulary-split logits
    (`sampling.vocab_parallel`); False gathers the logits to every device first and runs it
    whole there, as sgl-jax's own sampler does (same results, an all-gather of `[batch,
    vocab]` per step).
    `return_routed_experts` (MoE models only, default False): every completion also carries
    the experts each MoE layer routed each of its tokens (and its prompt's) to, for routing
    replay in the trainer (sgl-jax's `enable_return_routed_experts` capturer; its cost:
    `bench replay`). With `dp_size` 1 only: the pinned capturer mixes up data-parallel ranks.
    `share_group_prefill` (default True): when a call holds the same prompt more than once (a
    group of n samples), each distinct prompt is prefilled once, in a prefill-only pass whose
    KV the prefix cache then serves to every copy (sgl-jax's tokenizer manager does the same for
    `parallel_sample_num`); each copy computes only its last prompt token. Needs the radix
    cache (`disable_radix_cache=False`); counts in `RolloutEngine.prefill_counts`. The pass is
    one more engine pass per call: with 16-token prompts it cost more than it saved
    (`bench grpo`, `bench tail` in docs/benchmarks.md).
    `compilation_cache_dir` (default None: the environment variable
    `SGL_JAX_ROLLOUT_COMPILATION_CACHE_DIR`, else no cache): JAX's persistent compilation cache
    for the whole process, engine and trainer (`utils.compilation_cache`): a start that finds
    its programs there reads them instead of compiling them.
    `native_attention` (default "paged"): what serves sgl-jax's native attention backend, the
    one it runs wherever the Pallas TPU kernel cannot (CPU, GPU). "paged": each request
    attends over its own KV slots, at any `page_size` (`engine/paged_attention.py`);
    "upstream": sgl-jax's own, every row against every request's slots, page_size 1 only on
    CPU (it reads a larger page's slots at the wrong offsets), kept to compare with
    (`bench attention`). The TPU kernel is not affected.
    `rope_phases` (default "trainer"): how the rotary phases are rounded in float32 (the
    `rope_phases` patch, `engine/rope_phases.py`). "trainer": as tunix's model of the
    checkpoint's `model_type` computes them (position divided by `base ** (2i / d)`, times its
    reciprocal for qwen2), bit for bit the trainer's, where tunix has a model of that type
    (upstream's elsewhere: `rope_phases.TUNIX_MODEL_TYPES`); "sgl-jax": upstream's (position times
    inverse frequencies computed in numpy, as transformers does). Both are the checkpoint's
    RoPE; they differ in the last bit of about half the phases, which on long contexts moves
    logprobs by up to 1e-4 (Gemma 3 270M). RoPE with frequencies of its own (llama3 scaling,
    YaRN, Gemma 4's) is upstream's under both.
    `numerics` (default "trainer"): how a bfloat16 engine rounds where tunix's model of the
    checkpoint rounds otherwise than sgl-jax (`engine/numerics.py`): "trainer": RMS norms in
    tunix's op order (Qwen2 / 3; Gemma 2 / 3's every step in bfloat16), attention weights
    normalised, then rounded, before the value product (Qwen2 / 3, Llama, Gemma 4) or the whole
    softmax in bfloat16 (Gemma 2 / 3; both the paged native attention only, not the TPU
    kernel), RoPE rotated in float32 (Llama, Gemma 2 / 3), Qwen3-MoE's router logits and
    routing weights in bfloat16; "sgl-jax": upstream's. float32 engines compute the same under
    both.
    """

    dtype: str = "auto"
    attention_backend: str = "fa"
    page_size: int = 1
    context_length: int = 1024
    max_running_requests: int = 64
    precompile_bs_paddings: tuple[int, ...] | None = (1, 4, 16, 64)
    precompile_token_paddings: tuple[int, ...] | None = (256, 1024, 4096)
    disable_precompile: bool = False
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = 32768
    chunked_prefill_size: int = -1
    max_prefill_tokens: int = 4096
    disable_radix_cache: bool = False
    tp_size: int = 1
    dp_size: int = 1
    device_indexes: tuple[int, ...] | None = None
    random_seed: int = 0
    log_level: str = "error"
    sampler_modes: tuple[dict[str, Any], ...] = ()
    overlap_schedule: bool = True
    vocab_parallel_sampler: bool = True
    return_routed_experts: bool = False
    share_group_prefill: bool = True
    native_attention: str = "paged"
    rope_phases: str = "trainer"
    numerics: str = "trainer"
    compilation_cache_dir: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {list(ATTENTION_BACKENDS)}, "
                f"got {self.attention_backend!r}"
            )
        _positive("page_size", self.page_size)
        if self.native_attention not in NATIVE_ATTENTIONS:
            raise ValueError(
                f"native_attention must be one of {list(NATIVE_ATTENTIONS)}, "
                f"got {self.native_attention!r}"
            )
        if self.rope_phases not in ROPE_PHASES:
            raise ValueError(
                f"rope_phases must be one of {list(ROPE_PHASES)}, got {self.rope_phases!r}"
            )
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {list(NUMERICS)}, got {self.numerics!r}")
        _positive("context_length", self.context_length, low=16)
        _positive("max_running_requests", self.max_running_requests)
        for name in ("precompile_bs_paddings", "precompile_token_paddings"):
            value = getattr(self, name)
            if value is None:
                continue
            value = tuple(value)
            object.__setattr__(self, name, value)
            if not value or any(not _is_int(v) or v < 1 for v in value):
                raise ValueError(f"{name} must be positive integers, got {list(value)}")
            if list(value) != sorted(set(value)):
                raise ValueError(f"{name} must be strictly increasing, got {list(value)}")
        bs = self.precompile_bs_paddings
        if bs is not None and bs[-1] < self.max_running_requests:
            raise ValueError(
                f"precompile_bs_paddings must cover max_running_requests "
                f"({self.max_running_requests}), largest is {bs[-1]}"
            )
        if (self.mem_fraction_static is None) == (self.max_total_tokens is None):
            raise ValueError("set exactly one of mem_fraction_static and max_total_tokens")
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        if self.max_total_tokens is not None:
            _positive("max_total_tokens", self.max_total_tokens, low=self.context_length)
        _positive("max_prefill_tokens", self.max_prefill_tokens, low=self.context_length)
        if not _is_int(self.chunked_prefill_size) or (
            self.chunked_prefill_size != -1 and self.chunked_prefill_size < self.page_size
        ):
            raise ValueError(
                f"chunked_prefill_size must be -1 (off) or >= page_size ({self.page_size}), "
                f"got {self.chunked_prefill_size!r}"
            )
        _positive("tp_size", self.tp_size)
        _positive("dp_size", self.dp_size)
        if self.tp_size % self.dp_size:
            raise ValueError(
                f"dp_size ({self.dp_size}) must divide tp_size ({self.tp_size}), the device count"
            )
        if self.device_indexes is not None:
            idx = tuple(self.device_indexes)
            object.__setattr__(self, "device_indexes", idx)
            if len(idx) != self.tp_size or len(set(idx)) != len(idx):
                raise ValueError(
                    f"device_indexes must be {self.tp_size} distinct device ids (tp_size), "
                    f"got {list(idx)}"
                )
        object.__setattr__(self, "sampler_modes", _sampler_modes(self.sampler_modes))
        cache_dir = self.compilation_cache_dir
        if cache_dir is not None:
            if not isinstance(cache_dir, (str, os.PathLike)) or not str(cache_dir):
                raise ValueError(
                    f"compilation_cache_dir must be a directory path or None, got {cache_dir!r}"
                )
            object.__setattr__(self, "compilation_cache_dir", str(cache_dir))
        forced = sorted(set(self.extra) & set(FORCED))
        if forced:
            raise ValueError(f"extra must not set {forced}: the rollout fixes them")
        if "disable_overlap_schedule" in self.extra:
            raise ValueError("extra must not set disable_overlap_schedule: use overlap_schedule")
        for name in SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if "enable_return_routed_experts" in self.extra:
            raise ValueError(
                "extra must not set enable_return_routed_experts: use return_routed_experts"
            )
        if self.return_routed_experts and self.dp_size > 1:
            # sgl-jax cddbf6f1 captures `out_cache_loc[:real_input_ids_len]` of a batch laid out
            # per data-parallel rank with padding, into one buffer indexed by slot ids that are
            # per rank (`routed_experts_capturer.py:253-259`, `schedule_batch.py:2079-2121`,
            # `allocator.py:101-103`): the rows of rank 1 and above would read other requests'.
            raise ValueError(
                f"return_routed_experts needs dp_size=1, got dp_size={self.dp_size}: the pinned "
                "sgl-jax records a data-parallel batch's experts at the wrong slots (it reads the "
                "per-rank layout as one), so rows on ranks above 0 would carry other requests' "
                "experts; use tp_size alone for the devices"
            )

    def replace(self, **changes: Any) -> EngineSettings:
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(f"unknown engine setting(s) {unknown}; allowed: {sorted(names)}")
        return dataclasses.replace(self, **changes)

    def server_args(
        self, model_path: str, device: str, window_kv_differs: bool = False
    ) -> dict[str, Any]:
        """Keyword arguments of sgl-jax's `Engine` for this model and device ("cpu", "tpu").
        `window_kv_differs`: the model's sliding-window layers keep keys and values of another
        shape than its full layers (`window_kv_differs`), so only a hybrid pool holds them."""
        args = {
            "model_path": model_path,
            "device": device,
            "dtype": self.dtype,
            "attention_backend": self.attention_backend,
            "page_size": self.page_size,
            "context_length": self.context_length,
            "max_running_requests": self.max_running_requests,
            "precompile_bs_paddings": _list(self.precompile_bs_paddings),
            "precompile_token_paddings": _list(self.precompile_token_paddings),
            "disable_precompile": self.disable_precompile,
            "mem_fraction_static": self.mem_fraction_static,
            "max_total_tokens": self.max_total_tokens,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "disable_radix_cache": self.disable_radix_cache,
            "tp_size": self.tp_size,
            "dp_size": self.dp_size,
            "device_indexes": _list(self.device_indexes),
            "random_seed": self.random_seed,
            "log_level": self.log_level,
            "disable_overlap_schedule": not self.overlap_schedule,
            "enable_return_routed_experts": self.return_routed_experts,
        }
        if (device == "cpu" or self.attention_backend == "native") and not window_kv_differs:
            # sgl-jax's CPU attention writes the KV cache through `set_kv_buffer_legacy`
            # (`layers/attention/native_backend.py:143`), which its sliding-window pool lacks
            # (`SWAKVPool`, `mem_cache/memory_pool.py:768`). One full pool, the window the
            # mask's, where one pool can hold every layer; where it cannot (Gemma 4), the
            # hybrid pool through the `swa_pool_native_attention` patch.
            args["disable_hybrid_swa_memory"] = True
        args.update(self.extra)
        args.update(FORCED)
        return args


def _sampler_modes(modes: Any) -> tuple[dict[str, Any], ...]:
    from sgl_jax_rollout.engine.rows import MODE_FIELDS
    from sgl_jax_rollout.sampling.options import SamplingOptions

    if isinstance(modes, dict) or not isinstance(modes, (tuple, list)):
        raise ValueError(f"sampler_modes must be a list of dicts, got {modes!r}")
    checked = []
    for i, mode in enumerate(modes):
        if not isinstance(mode, dict):
            raise ValueError(f"sampler_modes[{i}] must be a dict, got {mode!r}")
        unknown = sorted(set(mode) - {*MODE_FIELDS, "penalties"})
        if unknown:
            raise ValueError(
                f"sampler_modes[{i}] has unknown field(s) {unknown}; allowed: "
                f"{[*MODE_FIELDS, 'penalties']}"
            )
        if not isinstance(mode.get("penalties", False), bool):
            raise ValueError(
                f"sampler_modes[{i}].penalties must be a bool, got {mode['penalties']!r}"
            )
        try:
            SamplingOptions(**{k: v for k, v in mode.items() if k != "penalties"})
        except (TypeError, ValueError) as err:
            raise ValueError(f"sampler_modes[{i}]: {err}") from None
        checked.append(dict(mode))
    return tuple(checked)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(name: str, value: Any, low: int = 1) -> None:
    if not _is_int(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _list(value: tuple[int, ...] | None) -> list[int] | None:
    return None if value is None else list(value)


def window_kv_differs(model_config: dict[str, Any]) -> bool:
    """Whether an HF config's sliding-window layers keep KV of another shape than its full
    layers (Gemma 4: `head_dim` / `num_key_value_heads` for the window's layers,
    `global_head_dim` / `num_global_key_value_heads` for the others; under `text_config` for
    a multimodal checkpoint)."""
    text = language_config(model_config)
    head_dim, heads = text.get("head_dim"), text.get("num_key_value_heads")
    return text.get("global_head_dim", head_dim) != head_dim or (
        text.get("num_global_key_value_heads", heads) != heads
    )


# config.json keys of a MoE's expert count (sgl-jax's `_TOTAL_EXPERT_FIELDS`,
# `layers/routed_experts_capturer.py`).
EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def served_dtype(dtype: str, model_config: dict[str, Any]) -> str:
    """`EngineSettings.dtype` as sgl-jax's `Engine` takes it for config.json `model_config`:
    "auto" is the language model's dtype, which a multimodal checkpoint's `text_config` may
    leave to the top level (Gemma 3 4B and up, written by transformers 4.50). sgl-jax resolves
    "auto" from the text config alone and takes float32 when it names none
    (`configs/model_config.py:228, 875-884`): it would serve a bfloat16 checkpoint in float32
    while the trainer loads it in bfloat16. Any other value is kept."""
    if dtype != "auto" or "text_config" not in model_config:
        return dtype
    text = language_config(model_config)
    named = text.get("torch_dtype") or text.get("dtype")
    return named if named in DTYPES else dtype


def resolved_dtype(dtype: str, model_config: dict[str, Any]) -> str:
    """The dtype an engine of `EngineSettings.dtype == dtype` computes in for config.json
    `model_config`: "auto" resolved as sgl-jax resolves it (the language model's dtype,
    float32 where none is named)."""
    served = served_dtype(dtype, model_config)
    if served != "auto":
        return served
    text = language_config(model_config)
    named = text.get("torch_dtype") or text.get("dtype")
    return named if named in DTYPES and named != "auto" else "float32"
