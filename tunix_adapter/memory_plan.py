"""A memory plan before the run: what the trainer and the engine hold per device.

Owns `plan` (a `Plan` from a model's config, a preset and the run's batch) and `CHIP_BYTES`
(device memory per TPU generation, with sources). Per device of each mesh:

- trainer (the preset's trainer mesh, fsdp x tp, every array sharded over all of it): the
  actor's parameters, the reference's (GRPO with a KL term), the gradients and Adam's two
  moments of what is trained (all parameters, or the LoRA adapters), in the checkpoint's
  dtype; activations of one micro-batch, an estimate: per layer `tokens * (34 * hidden + 5 *
  heads * seq)` bytes at 2 bytes a value (Korthikanti et al. 2022, "Reducing Activation
  Recomputation", eq. 1), or with remat the layer inputs and one layer's worth; plus the
  float32 logits and their log-softmax (`tokens * vocab * 8`);
- engine (the rollout mesh's tp): the weights in the engine's dtype, split over tp; the KV
  pool as sgl-jax sizes it: `max_total_tokens` tokens (plus one page) when the settings give
  it, else what `mem_fraction_static` leaves of the device once the weights already there
  (trainer and engine) are counted (sgl-jax `model_runner_kv_cache_mixin.py`,
  `_profile_available_bytes`: `available - total * (1 - fraction)`), at
  `layers * 2 * kv_heads_per_device * align128(head_dim) * itemsize` a token
  (`_compute_cell_size`).

It then says whether the run fits the chip with the engine's memory kept, with its KV pool
released while the trainer updates, and with its weights released too
(`SglangJaxRollout.release_memory`), and what to change when it does not. Each peak is the
larger of the trainer's update (its arrays and activations, beside what the engine keeps) and
the weight sync (two copies of the engine's weights while it maps the new ones, with its KV
pool where that is kept; after a release the KV pool comes back once the new weights are in).

The parameter count is the checkpoint's own (safetensors headers) where the weights are
there, else counted from the config (dense Qwen / Llama layout); of a multimodal checkpoint,
its language model's (its `text_config`; the vision tower is loaded by neither side).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from sgl_jax_rollout.utils import model_dir as model_dir_lib

GiB = 2**30
# HBM per chip, from Google Cloud's TPU system architecture pages.
CHIP_BYTES = {
    "v4": (32 * GiB, "cloud.google.com/tpu/docs/v4: 32 GiB HBM2 per chip"),
    "v5e": (16 * GiB, "cloud.google.com/tpu/docs/v5e: 16 GiB HBM2 per chip"),
    "v5p": (95 * GiB, "cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e per chip"),
    "v6e": (32 * GiB, "cloud.google.com/tpu/docs/v6e: 32 GiB HBM per chip"),
}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class Plan:
    """Bytes per device; `fits` maps each release mode to a verdict (None: no chip memory
    known, as on CPU)."""

    trainer: dict[str, int]
    engine: dict[str, int]
    chip_bytes: int | None
    chip_source: str
    peaks: dict[str, int]
    fits: dict[str, bool | None]
    advice: list[str]

    def table(self) -> str:
        rows = [(f"trainer {k}", v) for k, v in self.trainer.items()]
        rows += [(f"engine {k}", v) for k, v in self.engine.items()]
        rows += [(f"peak, engine memory {k}", v) for k, v in self.peaks.items()]
        lines = [f"{'per device':<44} {'GiB':>9}"]
        lines += [f"{name:<44} {value / GiB:>9.3f}" for name, value in rows]
        chip = "unknown" if self.chip_bytes is None else f"{self.chip_bytes / GiB:.1f} GiB"
        lines.append(f"chip memory: {chip} ({self.chip_source})")
        for mode, ok in self.fits.items():
            verdict = "unknown" if ok is None else ("fits" if ok else "does NOT fit")
            lines.append(f"engine memory {mode}: {verdict}")
        lines += [f"advice: {line}" for line in self.advice]
        return "\n".join(lines)


def plan(
    model_dir: str | Path,
    preset: Any,
    *,
    batch: int,
    seq_len: int,
    lora_rank: int = 0,
    remat: bool = False,
    with_reference: bool = True,
    chip_bytes: int | None = None,
) -> Plan:
    """The plan of a run of `model_dir` on `preset` (a `tpu_configs.Preset`) with trainer
    micro-batches of `batch` sequences of `seq_len` tokens. `chip_bytes`: the device's memory
    (default: the device's own where JAX reports it, else `CHIP_BYTES` by the preset's
    slice)."""
    if batch < 1 or seq_len < 1:
        raise ValueError(f"batch and seq_len must be >= 1, got {batch} and {seq_len}")
    if lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
    config = model_dir_lib.read_config(model_dir)
    try:
        shape = _Shape.of(model_dir_lib.language_config(config))
    except KeyError as err:
        raise model_dir_lib.missing_key(model_dir, config, err) from None
    params = parameter_count(model_dir, config)
    ckpt = ITEMSIZE[str(config.get("torch_dtype", "float32"))]
    settings = preset.engine_settings()
    engine_dtype = settings.dtype if settings.dtype != "auto" else config.get("torch_dtype")
    engine_item = ITEMSIZE[str(engine_dtype)]

    devices = preset.trainer_devices
    trained = shape.lora_params(lora_rank) if lora_rank else params
    trainer = {
        "actor": params * ckpt // devices,
        "reference": params * ckpt // devices if with_reference else 0,
        "gradients": trained * ckpt // devices,
        "optimizer (Adam)": 2 * trained * ckpt // devices,
        "activations (estimate)": shape.activations(batch, seq_len, remat, preset),
    }
    tp = preset.rollout_tp
    weights = params * engine_item // tp
    cell = shape.kv_cell(tp, engine_item)
    if settings.max_total_tokens is not None:
        kv = (settings.max_total_tokens + settings.page_size) * cell
    else:
        known = chip_bytes if chip_bytes is not None else _chip(preset)[0]
        resident = trainer["actor"] + trainer["reference"] + weights
        kv = 0 if known is None else max(0, int(known * settings.mem_fraction_static) - resident)
        kv = kv // cell * cell
    engine = {"weights": weights, "KV pool": kv}

    static = trainer["actor"] + trainer["reference"] + trainer["gradients"]
    static += trainer["optimizer (Adam)"]
    act = trainer["activations (estimate)"]
    # At a weight sync the engine holds two copies of its weights while it maps the new ones
    # (the old, or stand-ins for released ones); after a release it maps them before taking
    # its KV pool back (`RolloutEngine.update_weights`), so the two never meet the KV pool.
    sync = 2 * weights
    peaks = {
        "kept": static + max(act + weights, sync) + kv,
        "KV released": static + max(act + weights, sync, weights + kv),
        "KV and weights released": static + max(act, sync, weights + kv),
    }
    chip, source = (chip_bytes, "given") if chip_bytes is not None else _chip(preset)
    fits = {mode: None if chip is None else peak <= chip for mode, peak in peaks.items()}
    return Plan(trainer, engine, chip, source, peaks, fits, _advice(fits, peaks, chip, kv, act))


# A multimodal checkpoint's language model (the part trainer and engine load): its tensors'
# names begin with one of these (`utils.model_dir.LANGUAGE_MODEL_PREFIXES`, Gemma 4's
# `model.language_model.`, an untied `lm_head`).
_LANGUAGE_MODEL_NAMES = ("language_model.", "model.language_model.", "lm_head.")


def parameter_count(model_dir: str | Path, config: dict) -> int:
    """The checkpoint's parameters: from its safetensors headers, else from the config. Of a
    multimodal checkpoint (a `text_config`), its language model's only: neither the trainer nor
    the engine loads the vision tower."""
    nested = "text_config" in config
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        count = 0
        for file in files:
            with safe_open(file, "numpy") as f:
                names = f.keys()  # a safetensors file, not a dict
                kept = [k for k in names if not nested or k.startswith(_LANGUAGE_MODEL_NAMES)]
                count += sum(math.prod(f.get_slice(k).get_shape()) for k in kept)
        return count
    return _Shape.of(model_dir_lib.language_config(config)).params()


@dataclasses.dataclass(frozen=True)
class _Shape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool
    qk_norm: bool
    bias: bool

    @classmethod
    def of(cls, config: dict) -> _Shape:
        heads = config["num_attention_heads"]
        return cls(
            vocab=config["vocab_size"],
            hidden=config["hidden_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            ffn=config["intermediate_size"],
            tied=bool(config.get("tie_word_embeddings", False)),
            qk_norm=config.get("model_type") == "qwen3",
            bias=config.get("model_type") == "qwen2",
        )

    def params(self) -> int:
        """Dense Qwen / Llama: embeddings (twice untied), attention, MLP, norms."""
        d, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.bias else 0)
        layer = attention + 3 * d * self.ffn + 2 * d + (2 * self.head_dim if self.qk_norm else 0)
        return self.vocab * d * (1 if self.tied else 2) + self.layers * layer + d

    def lora_params(self, rank: int) -> int:
        """Adapters of rank `rank` on every attention and MLP projection."""
        d, q, kv, f = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.ffn,
        )
        per_layer = (d + q) + 2 * (d + kv) + (q + d) + 2 * (d + f) + (f + d)
        return self.layers * rank * per_layer

    def kv_cell(self, tp: int, itemsize: int) -> int:
        """KV bytes per token per device (sgl-jax `_compute_cell_size`: kv heads split over
        tp, at least one per device; head_dim padded to a multiple of 128)."""
        heads = max(1, self.kv_heads // tp)
        return self.layers * 2 * heads * (-(-self.head_dim // 128) * 128) * itemsize

    def activations(self, batch: int, seq_len: int, remat: bool, preset: Any) -> int:
        tokens = batch * seq_len / preset.trainer_fsdp
        per_layer = tokens * (34 * self.hidden + 5 * self.heads * seq_len) / preset.trainer_tp
        inputs = tokens * self.hidden * 2 * self.layers
        layers = inputs + per_layer if remat else per_layer * self.layers
        logits = tokens * self.vocab * 8 / preset.trainer_tp
        return int(layers + logits)


def _chip(preset: Any) -> tuple[int | None, str]:
    import jax

    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]), f"{device.device_kind}: memory_stats()['bytes_limit']"
    slice_name = preset.slice.replace("v5litepod", "v5e")
    for generation, (size, source) in CHIP_BYTES.items():
        if slice_name.startswith(generation):
            return size, source
    return None, f"no device memory known for slice {preset.slice!r}"


def _advice(fits: dict, peaks: dict, chip: int | None, kv: int, act: int) -> list[str]:
    if chip is None:
        return ["no chip memory known here: pass the chip's bytes to check a TPU plan"]
    if fits["kept"]:
        return ["fits with the engine's memory kept; releasing it only adds headroom"]
    if fits["KV released"]:
        return ["release the engine's KV pool while the trainer updates (build_cluster's default)"]
    if fits["KV and weights released"]:
        return ["release the engine's weights too: build_cluster(release_rollout_memory='weights')"]
    over = peaks["KV and weights released"] - chip
    advice = [f"over the chip by {over / GiB:.2f} GiB even with everything released:"]
    if kv:
        advice.append("fewer KV tokens (max_total_tokens, or a lower mem_fraction_static)")
    if act:
        advice.append("a smaller micro-batch or remat (the activations are the estimate above)")
    advice.append("LoRA instead of full weights, or a preset with more chips")
    return advice
