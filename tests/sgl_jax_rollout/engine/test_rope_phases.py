"""`engine/rope_phases.py`: each rule's phases against tunix's own RoPE code, bit for bit, and
against float64 phases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout import tunix_compat
from sgl_jax_rollout.engine import rope_phases

POSITIONS = jnp.arange(0, 4096, dtype=jnp.int32)


def _tunix_cos_sin(package: str, head_dim: int, base: float, scale: float = 1.0):
    """cos and sin of tunix's `apply_rope` in `package`, read off a rotated unit vector."""
    model = tunix_compat.model_module(package, "model")
    half = head_dim // 2
    x = jnp.concatenate(
        [jnp.ones((1, len(POSITIONS), 1, half)), jnp.zeros((1, len(POSITIONS), 1, half))], -1
    )
    if package == "gemma3":
        rope = lambda x, p: model.apply_rope(  # noqa: E731
            x, p, head_dim=head_dim, base_frequency=base, scale_factor=scale
        )
    else:
        rope = lambda x, p: model.apply_rope(x, p, head_dim, base)  # noqa: E731
    out = jax.jit(rope)(x, POSITIONS[None])[0, :, 0]
    return out[:, :half], out[:, half:]


@pytest.mark.parametrize(
    ("package", "head_dim", "base", "scale"),
    [
        ("gemma3", 256, 10_000, 1.0),
        ("gemma3", 256, 1_000_000, 8.0),
        ("qwen3", 128, 1_000_000, 1.0),
        ("llama3", 64, 500_000, 1.0),
    ],
)
def test_timescale_phases_are_tunix_apply_ropes_bit_for_bit(package, head_dim, base, scale):
    want_cos, want_sin = _tunix_cos_sin(package, head_dim, base, scale)
    cos, sin = jax.jit(lambda p: rope_phases.cos_sin(p, head_dim, base, "timescale", scale))(
        POSITIONS
    )
    np.testing.assert_array_equal(cos, want_cos)
    np.testing.assert_array_equal(sin, want_sin)
    # upstream's rounding (numpy inverse frequencies, times the position) is not the trainer's
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)) / scale
    upstream_cos = jnp.cos(POSITIONS.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq))
    assert np.mean(np.asarray(upstream_cos) != np.asarray(want_cos)) > 0.05


def test_inverse_timescale_phases_are_tunix_qwen2s_bit_for_bit():
    qwen2 = tunix_compat.model_module("qwen2", "model")
    want_sin, want_cos = jax.jit(lambda p: qwen2._generate_pos_embeddings(p, 128, 1_000_000))(
        POSITIONS[None]
    )
    cos, sin = jax.jit(lambda p: rope_phases.cos_sin(p, 128, 1_000_000, "inverse_timescale"))(
        POSITIONS
    )
    np.testing.assert_array_equal(cos, want_cos[0])
    np.testing.assert_array_equal(sin, want_sin[0])
    assert rope_phases.trainer_rule("qwen2") == "inverse_timescale"
    for model_type in ("qwen3", "qwen3_moe", "llama", "gemma2", "gemma3_text", "gemma3"):
        assert rope_phases.trainer_rule(model_type) == "timescale"
    # no tunix model: no trainer's rounding, upstream's phases, and `check` says so
    for model_type in ("phi3", "mistral", "internlm3"):
        assert rope_phases.trainer_rule(model_type) == "inv_freq"
        assert "tunix has no" in rope_phases.described(model_type, "trainer")
    assert rope_phases.described("qwen2", "trainer") == "tunix's qwen2 model's (inverse timescale)"
    assert rope_phases.described("qwen2", "sgl-jax").startswith("sgl-jax's")


def test_the_model_types_with_a_trainer_rule_are_those_tunix_adapter_loads():
    from tunix_adapter import models

    assert {*models._TUNIX_MODELS, *models._GEMMA_TYPES} == rope_phases.TUNIX_MODEL_TYPES


@pytest.mark.parametrize("rule", ["timescale", "inverse_timescale"])
def test_every_rule_is_within_float32_rounding_of_the_exact_phases(rule):
    head_dim, base = 256, 10_000
    cos, sin = jax.jit(lambda p: rope_phases.cos_sin(p, head_dim, base, rule))(POSITIONS)
    phase = np.arange(4096, dtype=np.float64)[:, None] / base ** (
        np.arange(0, head_dim, 2) / head_dim
    )
    # a few ulps of the phase (2.4e-7 rad per unit of phase at float32)
    bound = 4 * np.finfo(np.float32).eps * np.maximum(phase, 1.0) + 1e-6
    assert np.all(np.abs(np.asarray(cos, np.float64) - np.cos(phase)) <= bound)
    assert np.all(np.abs(np.asarray(sin, np.float64) - np.sin(phase)) <= bound)


def test_a_rule_without_scaling_or_unknown_is_refused_by_name():
    with pytest.raises(ValueError, match="inverse_timescale"):
        rope_phases.cos_sin(POSITIONS, 64, 10_000, "inverse_timescale", 2.0)
    with pytest.raises(ValueError, match="rule must be"):
        rope_phases.cos_sin(POSITIONS, 64, 10_000, "inv_freq")
