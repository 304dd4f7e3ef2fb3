"""`engine/models/gemma3.py`, Gemma 3 text for sgl-jax: each layer's kind, window and RoPE from
the config, HF's "linear" scaling on the full layers only, the q / k norms' weights mapped, and
the registration the engine loads it by. Built as sgl-jax's loader builds a model
(`nnx.eval_shape`, no weights); the served numbers are checked against tunix's trainer in
`tests/tunix_adapter/test_families_engine.py`."""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytestmark = pytest.mark.engine

KINDS = ["sliding_attention"] * 5 + ["full_attention"]


def text_config(**changes):
    from transformers import Gemma3TextConfig

    values = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        sliding_window=256,
        layer_types=KINDS,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        query_pre_attn_scalar=256,
        max_position_embeddings=4096,
    )
    values.update(changes)
    return Gemma3TextConfig(**values)


def build(config):
    from flax import nnx

    from sgl_jax_rollout.engine.models.gemma3 import Gemma3ForCausalLM

    explicit = (jax.sharding.AxisType.Explicit,) * 2
    mesh = jax.make_mesh((1, 1), ("data", "tensor"), axis_types=explicit, devices=jax.devices()[:1])
    with jax.set_mesh(mesh):
        return nnx.eval_shape(lambda: Gemma3ForCausalLM(config, mesh=mesh, dtype=np.float32))


def test_layer_kinds_come_from_layer_types_else_the_sliding_window_pattern():
    from sgl_jax_rollout.engine.models.gemma3 import layer_kinds

    assert layer_kinds(text_config()) == KINDS
    config = text_config(num_hidden_layers=8, layer_types=None)
    config.layer_types, config.sliding_window_pattern = None, 4
    assert layer_kinds(config) == (["sliding_attention"] * 3 + ["full_attention"]) * 2


def test_windowed_layers_attend_the_window_with_the_local_rope_full_layers_everything():
    from sgl_jax_rollout.engine.models.gemma3 import LinearScalingRotaryEmbedding

    model = build(text_config(rope_scaling={"rope_type": "linear", "factor": 8.0}))
    for layer, kind in zip(model.model.layers, KINDS, strict=True):
        attention = layer.self_attn
        windowed = kind == "sliding_attention"
        assert attention.attn.sliding_window_size == (256 if windowed else None)
        assert attention.attn.scaling == 256**-0.5 and attention.attn.logit_cap is None
        assert attention.rotary_emb.base == (10_000.0 if windowed else 1_000_000.0)
        scaled = isinstance(attention.rotary_emb, LinearScalingRotaryEmbedding)
        assert scaled == (not windowed)
        assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (256,)
    assert model.logits_processor.soft_cap is None


def test_linear_scaling_rotates_as_the_unscaled_rope_at_positions_over_the_factor():
    from sgl_jax_rollout.engine.models.gemma3 import LinearScalingRotaryEmbedding, RotaryEmbedding

    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 4, 256)).astype(np.float32)
    k = rng.standard_normal((5, 1, 256)).astype(np.float32)
    positions = np.array([0, 1, 700, 1500, 4000])
    scaled = LinearScalingRotaryEmbedding(256, 256, 4096, 1e6, True, np.float32, 8.0)
    plain = RotaryEmbedding(256, 256, 4096, 1e6, True, np.float32)
    got = scaled(positions, q, k)
    want = plain(positions / 8.0, q, k)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
    assert not np.allclose(np.asarray(got[0]), np.asarray(plain(positions, q, k)[0]))


def test_every_parameter_has_its_hf_weight_including_the_q_and_k_norms():
    from flax import nnx

    model = build(text_config())
    mappings = model._create_weight_mappings()
    params = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model))}
    targets = {m.target_path for m in mappings.values()}
    assert targets == params
    assert mappings["model.layers.5.self_attn.k_norm.weight"].target_path == (
        "model.layers.5.self_attn.k_norm.weight"
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"hidden_activation": "gelu"}, "hidden_activation"),
    ],
)
def test_what_the_model_does_not_compute_is_refused_by_name(change, named):
    with pytest.raises(ValueError, match=named):
        build(text_config(**change))


def test_gemma3_is_registered_for_the_engine():
    """sgl-jax at the pin has no Gemma 3 text model; `patches.models` registers ours. When
    upstream ships one, the first assertion fails: the registration can go."""
    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.models import gemma3
    from sgl_jax_rollout.engine.patches import models

    upstreams = upstream.module("models.registry").import_model_classes()
    names = ["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"]
    assert not set(names) & set(upstreams)
    models.install()
    registered = upstream.get("ModelRegistry").models
    assert [registered[name] for name in names] == gemma3.EntryClass


@pytest.mark.parametrize("prefix", ["language_model.model.", "model.language_model."])
def test_the_multimodal_checkpoints_text_part_maps_every_parameter_under_its_prefix(prefix):
    """`Gemma3ForConditionalGeneration` builds the text model of `text_config` and reads its
    weights under the prefix the checkpoint uses (`load_weights` sets it from the headers,
    `utils.model_dir.checkpoint_prefix`); the vision tower is not built."""
    from flax import nnx
    from transformers import Gemma3Config

    from sgl_jax_rollout.engine.models.gemma3 import Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config=text_config(rope_scaling={"rope_type": "linear", "factor": 8.0}).to_dict(),
        vision_config={"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2},
    )
    mesh = jax.make_mesh(
        (1, 1), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
    )
    with jax.set_mesh(mesh):
        model = nnx.eval_shape(
            lambda: Gemma3ForConditionalGeneration(config, mesh=mesh, dtype=np.float32)
        )
    model.weight_prefix = prefix
    mappings = model._create_weight_mappings()
    params = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model))}
    assert {m.target_path for m in mappings.values()} == params
    assert all(name.startswith(prefix) for name in mappings)
    assert mappings[prefix + "layers.5.self_attn.k_norm.weight"].target_path == (
        "model.layers.5.self_attn.k_norm.weight"
    )
    assert model.model.layers[5].self_attn.rotary_emb.scaling_factor == 8.0
