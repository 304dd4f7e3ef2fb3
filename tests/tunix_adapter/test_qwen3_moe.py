"""Qwen3-MoE without the engine: the replica's config reaches tunix's Qwen3 `ModelConfig` (experts,
top-k, the experts' width), what tunix's `MoELayer` cannot follow is refused by name, and the
engine mapping (`engine.moe_mapping`) covers every tunix parameter of the replica with the
layout sgl-jax's Qwen3-MoE has."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("moe") / "moe", like="qwen3-30b-a3b")


def test_the_replica_reaches_tunix_with_its_experts(replica):
    from tunix_adapter.models import tunix_model_config

    hf = json.loads((replica / "config.json").read_text())
    config = tunix_model_config(replica)
    assert (config.num_experts, config.num_experts_per_tok) == (128, 8)
    assert config.hidden_dim == hf["moe_intermediate_size"] != hf["intermediate_size"]
    assert not config.use_tied_embedding


@pytest.mark.parametrize(
    "key, value",
    [
        ("norm_topk_prob", False),
        ("decoder_sparse_step", 2),
        ("mlp_only_layers", [0]),
        ("shared_expert_intermediate_size", 64),
    ],
)
def test_what_tunix_moe_layer_cannot_follow_is_refused_by_name(replica, tmp_path, key, value):
    from tunix_adapter.models import tunix_model_config

    hf = json.loads((replica / "config.json").read_text())
    hf[key] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=key):
        tunix_model_config(tmp_path)


def test_the_mapping_covers_every_tunix_parameter_with_the_engines_names(replica):
    """Every tunix parameter of the replica matches exactly one source pattern, whose target is
    a sgl-jax Qwen3-MoE name (`c_proj`, `moe_gate`, `wi_0` / `wi_1` / `wo`), and the experts'
    stacked layout passes through untransposed."""
    import re

    from flax import nnx

    from sgl_jax_rollout import tunix_compat
    from sgl_jax_rollout.engine.moe_mapping import engine_module, qwen3_moe_mapping
    from tunix_adapter.models import load_tunix_model

    table = tunix_compat.model_module("qwen3", "mapping_sglang_jax").SGLANG_JAX_MAPPING
    mapping = qwen3_moe_mapping(table)
    state = nnx.state(load_tunix_model(replica), nnx.Param)
    names = [".".join(map(str, path)) for path, _ in nnx.to_flat_state(state)]
    targets = {}
    for name in names:
        hits = [
            (source, target)
            for source, (target, _) in mapping["to_hf_mappings"].items()
            if re.fullmatch(source.replace(".", r"\.").replace("*", r"(\d+)"), name)
        ]
        assert len(hits) == 1, (name, hits)
        layer = re.search(r"layers\.(\d+)\.", name)
        targets[name] = hits[0][1].replace("*", layer.group(1) if layer else "*")
    assert targets["layers.1.mlp.router.kernel"] == "model.layers.1.moe_gate.kernel"
    assert targets["layers.1.mlp.gate_proj"] == "model.layers.1.mlp.wi_0"
    assert targets["layers.1.mlp.down_proj"] == "model.layers.1.mlp.wo"
    assert targets["layers.0.attn.o_proj.w"] == "model.layers.0.self_attn.c_proj.weight"
    transposed = set(mapping["to_hf_transpose_keys"])
    assert not transposed & {"layers.*.mlp.gate_proj", "layers.*.mlp.up_proj"}
    lora = mapping["lora_to_hf_mappings"]
    assert lora["layers.*.attn.o_proj.w_lora_a"][0] == "model.layers.*.self_attn.c_proj.A_buffer"
    assert not any(source.startswith("layers.*.mlp.") for source in lora)
    # the engine's own module names for the LoRA path; the dense families keep tunix's
    assert engine_module("qwen3_moe", "o_proj") == "c_proj"
    assert engine_module("qwen3", "o_proj") == "o_proj"
