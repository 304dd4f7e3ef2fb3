"""RoPE as the checkpoint defines it in tunix's trainer models (`tunix_adapter.rope`).

Frequencies against an independent float64 transcription of HF's llama3 formula
(`transformers.modeling_rope_utils._compute_llama3_parameters`); the trainer's logits against
tunix unchanged where tunix was right; unsupported scaling refused by name.
"""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout import tunix_compat
from tunix_adapter import rope

LLAMA31 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def hf_llama3_inv_freq(head_dim: int, theta: float, s: dict) -> np.ndarray:
    """HF's loop form, element by element (transformers 4.57)."""
    base = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for freq in base:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(freq)
        elif wavelen > low_wavelen:
            out.append(freq / s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"]
            )
            out.append((1 - smooth) * freq / s["factor"] + smooth * freq)
    return np.asarray(out)


@pytest.mark.parametrize("factor", [8.0, 32.0])
def test_llama3_frequencies_follow_hf(factor):
    spec = dict(LLAMA31, factor=factor)
    pairs = tuple((k, float(spec[k])) for k in list(LLAMA31)[:4])
    got = rope.inverse_frequencies(128, 500000.0, pairs)
    np.testing.assert_allclose(got, hf_llama3_inv_freq(128, 500000.0, spec), rtol=1e-12)
    plain = rope.inverse_frequencies(128, 500000.0)
    np.testing.assert_allclose(plain, 500000.0 ** (-np.arange(0, 128, 2) / 128), rtol=1e-12)
    assert (got < plain).any() and (got == plain).any()  # low frequencies scaled, high kept


def forward(model, length: int = 1100):
    tokens = jnp.asarray(np.random.default_rng(0).integers(10, 900, (1, length)), jnp.int32)
    positions = jnp.arange(length)[None]
    mask = jnp.tril(jnp.ones((length, length), bool))[None]
    logits, _ = model(tokens, positions, None, mask)
    return np.asarray(logits)


def with_config(model_dir, **changes):
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return model_dir


@pytest.fixture
def tiny_llama(tmp_path):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path / "llama", arch="llama")


def test_the_trainer_uses_the_checkpoint_theta_and_scaling(tiny_llama):
    from tunix_adapter.models import load_tunix_model

    default = forward(load_tunix_model(with_config(tiny_llama, rope_theta=1_000_000.0)))
    theta = forward(load_tunix_model(with_config(tiny_llama, rope_theta=500000.0)))
    scaled = forward(load_tunix_model(with_config(tiny_llama, rope_scaling=LLAMA31)))
    # tunix alone computes `default` for all three (its apply_rope never sees the config).
    assert np.abs(theta - default).max() > 1e-2
    assert np.abs(scaled - theta).max() > 1e-2


def test_where_tunix_was_right_nothing_changes(tiny_llama):
    model_lib = tunix_compat.model_module("llama3", "model")

    from tunix_adapter.models import load_tunix_model

    model = load_tunix_model(with_config(tiny_llama, rope_theta=1_000_000.0))
    fixed = forward(model, 64)
    block = model_lib.Attention.block
    try:
        model_lib.Attention.block = block.__wrapped__  # tunix's own, default theta 1,000,000
        np.testing.assert_array_equal(forward(model, 64), fixed)
    finally:
        model_lib.Attention.block = block


def test_unsupported_rope_scaling_is_refused_by_name(tiny_llama):
    from tunix_adapter.models import load_tunix_model

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    with pytest.raises(ValueError, match="rope_scaling of type 'yarn'"):
        load_tunix_model(with_config(tiny_llama, rope_scaling=yarn))


def test_default_rope_type_is_no_scaling(tiny_llama):
    """HF writes `{"rope_type": "default"}` for no scaling: the same logits as without it."""
    from tunix_adapter.models import load_tunix_model

    plain = forward(load_tunix_model(with_config(tiny_llama, rope_scaling=None)), 64)
    default = load_tunix_model(with_config(tiny_llama, rope_scaling={"rope_type": "default"}))
    np.testing.assert_array_equal(forward(default, 64), plain)


def test_the_fix_applies_once():
    model_lib = tunix_compat.model_module("qwen3", "model")

    rope.fix_rope()
    block, apply_rope = model_lib.Attention.block, model_lib.apply_rope
    rope.fix_rope()
    assert model_lib.Attention.block is block and model_lib.apply_rope is apply_rope
