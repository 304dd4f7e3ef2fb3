"""tunix's Gemma 3 config from an HF Gemma 3 text config.json (`tunix_adapter.gemma3_config`):
the replica's fields reach tunix's `ModelConfig` (window, both RoPE bases, the full layers'
linear scaling, the query scale), and what tunix's Gemma 3 computes otherwise is refused by
name. No engine."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def replica_config(tmp_path_factory) -> dict:
    from sgl_jax_rollout.tiny_model import make_tiny_model

    out = make_tiny_model(tmp_path_factory.mktemp("g3") / "g3", like="gemma-3-1b-it")
    return json.loads((out / "config.json").read_text())


def test_the_replica_reaches_tunix_field_by_field(replica_config):
    from sgl_jax_rollout import tunix_compat
    from tunix_adapter.gemma3_config import gemma3_config

    config = gemma3_config(replica_config)
    norm = tunix_compat.model_module("gemma3", "model").QueryPreAttentionNormalisation
    assert (config.num_layers, config.num_embed, config.embed_dim) == (6, 262144, 64)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 1, 256)
    assert config.hidden_dim == replica_config["intermediate_size"]
    assert config.sliding_window_size == 256
    assert (config.local_base_frequency, config.global_base_frequency) == (10_000, 1_000_000)
    assert (config.local_scale_factor, config.global_scale_factor) == (1.0, 1.0)
    assert config.query_pre_attn_norm == norm.BY_ONE_OVER_SQRT_HEAD_DIM
    assert config.vision_config is None and str(config.param_dtype) == "bfloat16"


def test_linear_scaling_scales_the_full_layers_and_27b_scales_queries_by_width(replica_config):
    from sgl_jax_rollout import tunix_compat
    from tunix_adapter.gemma3_config import gemma3_config

    scaled = {**replica_config, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    config = gemma3_config(scaled)
    assert (config.local_scale_factor, config.global_scale_factor) == (1.0, 8.0)
    wide = {**replica_config, "head_dim": 128, "query_pre_attn_scalar": 16}  # hidden / heads
    norm = tunix_compat.model_module("gemma3", "model").QueryPreAttentionNormalisation
    assert gemma3_config(wide).query_pre_attn_norm == norm.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS


def test_the_layer_kinds_default_to_hf_s_pattern(replica_config):
    from tunix_adapter.gemma3_config import gemma3_config

    bare = {k: v for k, v in replica_config.items() if k != "layer_types"}
    assert gemma3_config(bare).num_layers == 6
    with pytest.raises(ValueError, match="layer_types"):
        gemma3_config({**bare, "sliding_window_pattern": 2})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("rms_norm_eps", 1e-5, "rms_norm_eps=1e-05"),
        ("hidden_activation", "gelu", "hidden_activation='gelu'"),
        ("attention_bias", True, "attention_bias=True"),
        ("tie_word_embeddings", False, "tie_word_embeddings=False"),
        ("attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0"),
        ("final_logit_softcapping", 30.0, "final_logit_softcapping=30.0"),
        ("use_bidirectional_attention", True, "use_bidirectional_attention"),
        ("layer_types", ["full_attention"] * 6, "five windowed layers then one full"),
        ("query_pre_attn_scalar", 100, "query_pre_attn_scalar=100"),
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "type 'yarn'"),
        ("vision_config", {"model_type": "siglip_vision_model"}, "Gemma3ForConditionalGeneration"),
    ],
)
def test_what_tunix_s_gemma3_does_not_compute_is_refused_by_name(
    replica_config, key, value, message
):
    from tunix_adapter.gemma3_config import gemma3_config

    with pytest.raises(ValueError, match=message):
        gemma3_config({**replica_config, key: value})


def test_models_routes_gemma3_text_to_tunix_s_gemma3(replica_config, tmp_path):
    from tunix_adapter.models import tunix_model_config

    (tmp_path / "config.json").write_text(json.dumps(replica_config))
    assert tunix_model_config(tmp_path).sliding_window_size == 256


@pytest.fixture(scope="module")
def multimodal_dir(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("g3mm") / "g3mm", like="gemma-3-4b-it")


def test_a_multimodal_checkpoint_trains_its_text_part_with_the_defaults_it_leaves_out(
    multimodal_dir,
):
    """Gemma 3 4B's text_config lists its sizes, window and RoPE scaling; head_dim, the query
    scale, both RoPE bases, the layer kinds and the dtype come from transformers' defaults and
    the top level. tunix loads the language model's weights bit for bit and skips the vision
    tower."""
    import numpy as np
    from safetensors.numpy import load_file

    from tunix_adapter.models import load_tunix_model, tunix_model_config

    config = tunix_model_config(multimodal_dir)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 2, 256)
    assert (config.sliding_window_size, config.global_scale_factor) == (256, 8.0)
    assert (config.local_base_frequency, config.global_base_frequency) == (10_000, 1_000_000)
    assert config.vision_config is None and str(config.param_dtype) == "bfloat16"
    model = load_tunix_model(multimodal_dir)
    tensors = load_file(str(multimodal_dir / "model.safetensors"))
    embedding = tensors["language_model.model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(model.embedder.input_embedding.value), embedding)


def test_a_multimodal_checkpoint_under_transformers_in_memory_names_is_refused(
    multimodal_dir, tmp_path
):
    """tunix's loader reads `language_model.model.` or `model.`: under `model.language_model.`
    it would skip every weight of the language model."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from tunix_adapter.models import load_tunix_model

    copy = shutil.copytree(multimodal_dir, tmp_path / "renamed")
    tensors = load_file(str(copy / "model.safetensors"))
    renamed = {
        k.replace("language_model.model.", "model.language_model."): v for k, v in tensors.items()
    }
    save_file(renamed, str(copy / "model.safetensors"))
    with pytest.raises(ValueError, match="sit under 'model.language_model.'"):
        load_tunix_model(copy)
