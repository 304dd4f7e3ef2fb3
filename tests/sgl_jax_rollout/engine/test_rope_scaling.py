"""A `rope_scaling` the engine's model does not apply is refused by name before the engine starts
(`engine.rope_scaling`): sgl-jax's qwen2 / qwen3 / qwen3-MoE models never read it, so a Qwen
checkpoint with YaRN would be served with unscaled RoPE; "default" is no scaling."""

from __future__ import annotations

import json
import threading

import pytest

from sgl_jax_rollout.engine import rope_scaling
from sgl_jax_rollout.engine.rope_scaling import check_rope_scaling

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def config(architecture: str, scaling) -> dict:
    return {"architectures": [architecture], "rope_scaling": scaling}


@pytest.mark.parametrize(
    "architecture", ["Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]
)
@pytest.mark.parametrize("scaling", [YARN, LLAMA3, {"type": "linear", "factor": 2.0}])
def test_qwen_models_apply_no_scaling(architecture, scaling):
    kind = scaling.get("rope_type", scaling.get("type"))
    with pytest.raises(ValueError, match=rf"rope_scaling of type '{kind}'.*{architecture}"):
        check_rope_scaling(config(architecture, scaling))


@pytest.mark.parametrize("scaling", [None, {}, {"rope_type": "default"}, {"type": "default"}])
@pytest.mark.parametrize("architecture", [*rope_scaling.APPLIED, "GemmaForCausalLM"])
def test_no_scaling_is_accepted_everywhere(architecture, scaling):
    check_rope_scaling(config(architecture, scaling))


@pytest.mark.parametrize("scaling", [LLAMA3, YARN])
def test_llama_applies_what_get_rope_applies(scaling):
    check_rope_scaling(config("LlamaForCausalLM", scaling))


def test_our_gemma3_applies_linear_scaling_only():
    """`engine/models/gemma3.py` scales its full layers' RoPE linearly, as HF's Gemma 3."""
    check_rope_scaling(config("Gemma3ForCausalLM", {"rope_type": "linear", "factor": 8.0}))
    with pytest.raises(ValueError, match="'yarn'.*Gemma3ForCausalLM"):
        check_rope_scaling(config("Gemma3ForCausalLM", YARN))
    # A multimodal checkpoint names its scaling in its text_config.
    nested = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"}
    text = {"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    check_rope_scaling({**nested, "text_config": text})
    with pytest.raises(ValueError, match="'yarn'.*Gemma3ForConditionalGeneration"):
        check_rope_scaling({**nested, "text_config": {**text, "rope_scaling": YARN}})


@pytest.mark.parametrize(
    ("architecture", "scaling", "named"),
    [
        ("LlamaForCausalLM", {"rope_type": "dynamic", "factor": 2.0}, "'dynamic'"),
        ("LlamaForCausalLM", {"factor": 2.0}, "None"),  # no type: upstream raises later
        ("SomeNewForCausalLM", LLAMA3, "SomeNewForCausalLM"),  # unread: no scaling only
    ],
)
def test_what_is_not_known_to_be_applied_is_refused(architecture, scaling, named):
    with pytest.raises(ValueError, match=named):
        check_rope_scaling(config(architecture, scaling))


def test_the_engine_refuses_before_it_starts(tmp_path):
    """No engine needed: the refusal comes before sgl-jax is imported or a thread started."""
    from sgl_jax_rollout.engine.engine import RolloutEngine
    from sgl_jax_rollout.tiny_model import make_tiny_model

    model_dir = make_tiny_model(tmp_path / "qwen3", arch="qwen3")
    path = model_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rope_scaling": YARN}))
    threads = threading.active_count()
    with pytest.raises(ValueError, match="rope_scaling of type 'yarn'.*Qwen3ForCausalLM"):
        RolloutEngine(model_dir)
    assert threading.active_count() == threads
