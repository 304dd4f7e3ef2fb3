"""Trainer agreement: where sgl-jax rounds a number another way than the trainer does
(catalog: `patches/__init__.py`).

Owns `install` for `rope_phases`: wraps `RotaryEmbedding.__init__` to record, on a plain rotary
embedding (sgl-jax's `RotaryEmbedding` itself, or a subclass that declares
`linear_phase_scaling`, as Gemma 3's), the phase rule of the engine being built
(`EngineHooks.rope_phases`), and `RotaryEmbedding._compute_cos_sin` to compute its phases by
that rule (`engine/rope_phases.py`). A subclass with frequencies of its own (llama3 scaling,
YaRN, Gemma 4's proportional RoPE) and an engine whose rule is "inv_freq" keep upstream's.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.engine import rope_phases, upstream
from sgl_jax_rollout.engine.patches.hooks import current, wrap


def install() -> None:
    rotary = upstream.get("RotaryEmbedding")
    wrap(rotary, "__init__", _phase_rule_recorded)
    wrap(rotary, "_compute_cos_sin", _phases_by_rule)


def _phase_rule_recorded(original, self, *args, **kwargs):
    original(self, *args, **kwargs)
    hooks = current()
    plain = type(self) is upstream.get("RotaryEmbedding") or getattr(
        type(self), "linear_phase_scaling", False
    )
    if hooks is not None and plain:
        self.phase_rule = hooks.rope_phases


def _phases_by_rule(original, self: Any, positions):
    rule = getattr(self, "phase_rule", "inv_freq")
    if rule == "inv_freq":
        return original(self, positions)
    return rope_phases.cos_sin(
        positions, self.rotary_dim, self.base, rule, getattr(self, "scaling_factor", 1.0)
    )
