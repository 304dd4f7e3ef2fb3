"""Trainer agreement: where sgl-jax rounds a number another way than the trainer does
(catalog: `patches/__init__.py`).

Owns `install` for `rope_phases`: wraps `RotaryEmbedding._compute_cos_sin` to compute a plain
rotary embedding's phases (sgl-jax's `RotaryEmbedding` itself, or a subclass that declares
`linear_phase_scaling`, as Gemma 3's) by the phase rule of the engine running it
(`EngineHooks.rope_phases`, `engine/rope_phases.py`), and `phase_rule`, which says that rule.
The rule is read when the phases are computed (the engine's forward being traced), never
stored on the embedding: sgl-jax caches rotary embeddings across engines (`get_rope`'s
`_ROPE_DICT`, `layers/embeddings.py:601-647` at cddbf6f1), so a rule stored at construction
would serve a later engine of the same process with an earlier one's. A subclass with
frequencies of its own (llama3 scaling, YaRN, Gemma 4's proportional RoPE), an engine whose
rule is "inv_freq", and phases computed with no engine active keep upstream's.
"""

from __future__ import annotations

from typing import Any

from sgl_jax_rollout.engine import rope_phases, upstream
from sgl_jax_rollout.engine.patches.hooks import current, wrap


def install() -> None:
    wrap(upstream.get("RotaryEmbedding"), "_compute_cos_sin", _phases_by_rule)


def phase_rule(rotary: Any) -> str:
    """The rule `rotary`'s phases are computed by now: the active engine's on a plain rotary
    embedding, else upstream's ("inv_freq")."""
    hooks = current()
    plain = type(rotary) is upstream.get("RotaryEmbedding") or getattr(
        type(rotary), "linear_phase_scaling", False
    )
    return hooks.rope_phases if hooks is not None and plain else "inv_freq"


def _phases_by_rule(original, self: Any, positions):
    rule = phase_rule(self)
    if rule == "inv_freq":
        return original(self, positions)
    return rope_phases.cos_sin(
        positions, self.rotary_dim, self.base, rule, getattr(self, "scaling_factor", 1.0)
    )
