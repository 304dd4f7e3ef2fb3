"""`rope_phases` (`patches/agreement.py`): sgl-jax's rotary embeddings, built while an engine's
hooks are active, compute their phases by the engine's rule (against `rope_phases.cos_sin`,
itself checked bit for bit against tunix in `test_rope_phases.py`) or upstream's; RoPE with
frequencies of its own stays upstream's. No engine starts."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.engine  # needs sgl-jax importable (no engine is started)

POSITIONS = jnp.arange(0, 2048, dtype=jnp.int32)


def _built_under(rule: str):
    from sgl_jax_rollout.engine import patches, upstream
    from sgl_jax_rollout.engine.collector import Collector
    from sgl_jax_rollout.engine.models.gemma3 import LinearScalingRotaryEmbedding

    patches.apply()
    hooks = patches.EngineHooks(collector=Collector(), valid_vocab_size=None, rope_phases=rule)
    patches.activate(hooks, 0.0)
    try:
        return (
            upstream.get("RotaryEmbedding")(128, 128, 4096, 1_000_000, True, jnp.float32),
            LinearScalingRotaryEmbedding(256, 256, 4096, 1_000_000, True, jnp.float32, 8.0),
            upstream.get("Llama3RotaryEmbedding")(
                64, 64, 4096, 500_000, True, jnp.float32, 32.0, 1.0, 4.0, 8192
            ),
        )
    finally:
        patches.deactivate(hooks)


def _upstream(rotary) -> tuple[np.ndarray, np.ndarray]:
    """sgl-jax's phases: position times the numpy inverse frequencies the embedding holds."""
    phase = POSITIONS.astype(jnp.float32)[:, None] * jnp.asarray(rotary._inv_freq_np)
    return np.asarray(jnp.cos(phase)), np.asarray(jnp.sin(phase))


def test_rotary_embeddings_compute_their_phases_by_the_engines_rule():
    from sgl_jax_rollout.engine import rope_phases

    plain, linear, llama3 = _built_under("timescale")
    for rotary, scale in ((plain, 1.0), (linear, 8.0)):
        # Whether the two rules round differently depends on the CPU: on AMD EPYC, XLA's
        # `position / timescale` is bit for bit `position * inv_freq` (0 of 131,072 phases
        # differ); elsewhere over 1% of them did. So the rule each embedding recorded is
        # checked too, which fails on any CPU when the wiring breaks.
        assert rotary.phase_rule == "timescale"
        got = rotary._compute_cos_sin(POSITIONS)
        want = rope_phases.cos_sin(POSITIONS, rotary.rotary_dim, rotary.base, "timescale", scale)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    # llama3 scaling has frequencies of its own: upstream's phases, under any rule
    assert getattr(llama3, "phase_rule", "inv_freq") == "inv_freq"
    np.testing.assert_array_equal(llama3._compute_cos_sin(POSITIONS)[0], _upstream(llama3)[0])

    for rotary in _built_under("inv_freq"):
        assert getattr(rotary, "phase_rule", "inv_freq") == "inv_freq"
        got = rotary._compute_cos_sin(POSITIONS)
        np.testing.assert_array_equal(got[0], _upstream(rotary)[0])
        np.testing.assert_array_equal(got[1], _upstream(rotary)[1])


def test_the_setting_is_refused_by_name_and_resolved_per_model_type():
    from sgl_jax_rollout.engine.settings import EngineSettings

    with pytest.raises(ValueError, match="rope_phases must be one of"):
        EngineSettings(rope_phases="transformers")
    assert EngineSettings().rope_phases == "trainer"
