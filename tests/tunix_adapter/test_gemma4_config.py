"""tunix's Gemma 4 config from an HF Gemma 4 config.json (`tunix_adapter.gemma4_config`): the
replica's fields reach tunix's `ModelConfig` (head sizes, KV heads of each layer kind, the
layer pattern, both RoPEs), and what tunix or the engine cannot follow is refused by name.
No engine."""

from __future__ import annotations

import copy
import json

import pytest


@pytest.fixture(scope="module")
def replica_config(tmp_path_factory) -> dict:
    from sgl_jax_rollout.tiny_model import make_tiny_model

    out = make_tiny_model(tmp_path_factory.mktemp("g4") / "g4", like="gemma-4-31b-it")
    return json.loads((out / "config.json").read_text())


def test_the_replica_reaches_tunix_field_by_field(replica_config):
    from sgl_jax_rollout import tunix_compat
    from tunix_adapter.gemma4_config import gemma4_config

    text = replica_config["text_config"]
    config = gemma4_config(replica_config)
    kinds = tunix_compat.model_module("gemma4", "model").AttentionType
    assert config.attention_pattern == (kinds.LOCAL_SLIDING,) * 5 + (kinds.GLOBAL,)
    assert (config.head_dim, config.global_key_size) == (256, 512)
    assert (config.num_kv_heads, config.num_global_kv_heads) == (text["num_key_value_heads"], 1)
    assert config.k_eq_v_global and config.sliding_window_size == 256
    assert (config.local_base_frequency, config.global_base_frequency) == (1e4, 1e6)
    assert (config.local_rope_proportion, config.global_rope_proportion) == (1.0, 0.25)
    assert config.final_logit_softcap == 30.0 and config.num_embed == text["vocab_size"]
    # HF reads the full layers' KV head count only where keys are values; so does this
    plain = copy.deepcopy(replica_config)
    plain["text_config"]["attention_k_eq_v"] = False
    assert gemma4_config(plain).num_global_kv_heads is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hidden_size_per_layer_input", 256, "per-layer embeddings"),
        ("num_kv_shared_layers", 2, "KV sharing"),
        ("enable_moe_block", True, "mixture-of-experts"),
        ("rms_norm_eps", 1e-5, "rms_norm_eps=1e-05"),
        ("hidden_activation", "gelu", "hidden_activation='gelu'"),
        ("layer_types", ["sliding_attention"], "layer_types must list 6 layers"),
        (
            "rope_parameters",
            {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
            "must have entries",
        ),
        (
            "rope_parameters",
            {
                "sliding_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5},
                "full_attention": {"rope_type": "proportional", "rope_theta": 1e6},
            },
            "sliding_attention=",
        ),
    ],
)
def test_what_tunix_or_the_engine_cannot_follow_is_refused_by_name(
    replica_config, key, value, message
):
    from tunix_adapter.gemma4_config import gemma4_config

    config = copy.deepcopy(replica_config)
    config["text_config"][key] = value
    with pytest.raises(ValueError, match=message):
        gemma4_config(config)
