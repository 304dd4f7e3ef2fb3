"""RoPE as the checkpoint defines it, in tunix's llama3 and qwen3 trainer models.

Owns one named adjustment of tunix (checked against google-tunix 0.1.7; tunix main at
c7d8950f has the same code): `tunix/models/llama3/model.py` `Attention.block` calls
`apply_rope(query_proj, segment_pos, head_dim=...)` without the config's `rope_theta`, so the
default 1,000,000 is always used, and applies no `rope_scaling`; `tunix/models/qwen3/model.py`
`Attention.block` omits `rope_theta` the same way (right only while it is 1,000,000). sgl-jax
applies both, so a Llama 3.x checkpoint (rope_theta 500000, "llama3" scaling) disagrees between
trainer and rollout by tenths of a nat and more after training.

`fix_rope()` wraps each module's `Attention.block` so that, during the call, the module's
`apply_rope` computes with the instance's `config.rope_theta` and, for a config built by
`rope_config` with a llama3 `rope_scaling`, HF's llama3 frequencies
(`transformers.modeling_rope_utils._compute_llama3_parameters`). Without scaling it calls
tunix's own `apply_rope` with the right theta, so where tunix was right (theta 1,000,000, no
scaling) nothing changes. Any other scaling type is refused by `rope_config`, naming the key.
The engine side needs its own fix for llama3 scaling (`engine.patches` llama3_rope_scaling);
with both, a Llama 3.1 replica agrees to 2e-6 past position 1,024.

Must not change anything else in tunix's models.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from sgl_jax_rollout import tunix_compat
from sgl_jax_rollout.engine.rope_scaling import scaling_kind

# tunix model packages whose Attention.block omits rope_theta (tunix 0.1.7, main c7d8950f).
PATCHED_PACKAGES = ("llama3", "qwen3")
SUPPORTED_SCALING = ("llama3",)
_MARK = "__sgl_jax_rollout_rope__"
_ROPE: contextvars.ContextVar[Any] = contextvars.ContextVar("sgl_jax_rollout_rope", default=None)


def rope_config(package: str, config: Any, hf: dict[str, Any]) -> Any:
    """`config` (a tunix ModelConfig) carrying the checkpoint's `rope_scaling`, or `config`
    itself when there is none. Raises ValueError naming `rope_scaling` for a type tunix's
    model cannot be made to compute."""
    has_scaling, kind = scaling_kind(hf)
    if not has_scaling:
        return config
    scaling = hf["rope_scaling"]
    if package not in PATCHED_PACKAGES or kind not in SUPPORTED_SCALING:
        raise ValueError(
            f"config.json rope_scaling of type {kind!r} is not supported for the tunix "
            f"{package} trainer model (supported: {list(SUPPORTED_SCALING)} on "
            f"{list(PATCHED_PACKAGES)}); the trainer would compute another function than the "
            "engine"
        )
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [name for name in fields if name not in scaling]
    if missing:
        raise ValueError(f"config.json rope_scaling (llama3) lacks {missing}")
    scaled = _scaled_config_class(type(config))
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return scaled(**values, rope_scaling=tuple((name, float(scaling[name])) for name in fields))


def inverse_frequencies(head_dim: int, theta: float, scaling: Any = None) -> np.ndarray:
    """RoPE inverse frequencies `theta ** (-2i / head_dim)`, with HF's llama3 scaling when
    `scaling` holds (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    as name / value pairs."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not scaling:
        return inv_freq
    s = dict(scaling)
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return np.where(medium, smoothed, scaled)


def fix_rope() -> None:
    """Idempotent: tunix's llama3 and qwen3 attention use the checkpoint's RoPE."""
    for package in PATCHED_PACKAGES:
        model_lib = tunix_compat.model_module(package, "model")
        attention = getattr(model_lib, "Attention", None)
        rope = getattr(model_lib, "apply_rope", None)
        if attention is None or rope is None or not hasattr(attention, "block"):
            raise RuntimeError(
                f"tunix.models.{package}.model no longer has Attention.block / apply_rope: "
                "review tunix_adapter.rope against this tunix release"
            )
        if getattr(attention.block, _MARK, False):
            continue
        params = list(inspect.signature(getattr(rope, "__wrapped__", rope)).parameters)
        if params[:4] != ["inputs", "positions", "head_dim", "rope_theta"]:
            raise RuntimeError(f"tunix.models.{package}.model.apply_rope changed: {params}")
        model_lib.apply_rope = _checkpoint_rope(rope, round_phases=package == "qwen3")
        attention.block = _with_config_rope(attention.block)


def _with_config_rope(block):
    @functools.wraps(block)
    def patched(self, *args, **kwargs):
        token = _ROPE.set(
            (float(self.config.rope_theta), getattr(self.config, "rope_scaling", None))
        )
        try:
            return block(self, *args, **kwargs)
        finally:
            _ROPE.reset(token)

    setattr(patched, _MARK, True)
    return patched


def _checkpoint_rope(original, round_phases: bool):
    """`original` (`package`'s `apply_rope`) with the checkpoint's theta and scaling; the
    scaled rotation rounds cos and sin to the activation dtype first where the package's own
    does (`round_phases`: qwen3's), else keeps them float32 and rounds once (llama3's)."""

    @functools.wraps(original)
    def apply_rope(inputs, positions, head_dim, rope_theta=None):
        current = _ROPE.get()
        if current is None:  # called outside an Attention.block: tunix's behaviour
            return original(
                inputs, positions, head_dim, *(() if rope_theta is None else (rope_theta,))
            )
        theta, scaling = current
        if not scaling:
            return original(inputs, positions, head_dim, rope_theta=theta)
        # tunix's rotation (half split, positions / timescale), with HF's llama3 frequencies.
        timescale = jnp.asarray(1.0 / inverse_frequencies(head_dim, theta, scaling), jnp.float32)
        angles = (positions[..., None] / timescale[None, None, :])[..., None, :]
        sin, cos = jnp.sin(angles), jnp.cos(angles)
        if round_phases:
            sin, cos = sin.astype(inputs.dtype), cos.astype(inputs.dtype)
        first, second = jnp.split(inputs, 2, axis=-1)
        out = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
        return out.astype(inputs.dtype)

    return apply_rope


@functools.cache
def _scaled_config_class(base: type) -> type:
    return dataclasses.make_dataclass(
        f"{base.__name__}WithRopeScaling",
        [("rope_scaling", tuple, dataclasses.field(default=()))],
        bases=(base,),
        # tunix 0.1.7's configs are frozen, tunix main's llama3 config is not (a dataclass
        # may only extend one of its own kind)
        frozen=base.__dataclass_params__.frozen,
    )
