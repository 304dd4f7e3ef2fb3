"""Engine settings: validation before anything starts, and the forced sgl-jax arguments."""

from __future__ import annotations

import pytest

from sgl_jax_rollout.engine.settings import FORCED, EngineSettings


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(dtype="int8"), "dtype"),
        (dict(page_size=0), "page_size"),
        (dict(context_length=8), "context_length"),
        (dict(precompile_bs_paddings=(4, 1)), "precompile_bs_paddings"),
        (dict(precompile_bs_paddings=(1, 4), max_running_requests=8), "max_running_requests"),
        (dict(precompile_token_paddings=(0, 16)), "precompile_token_paddings"),
        (dict(mem_fraction_static=0.5), "exactly one"),
        (dict(mem_fraction_static=1.2, max_total_tokens=None), "mem_fraction_static"),
        (dict(max_total_tokens=100), "max_total_tokens"),
        (dict(chunked_prefill_size=0), "chunked_prefill_size"),
        (dict(tp_size=4, dp_size=3), "dp_size"),
        (dict(tp_size=2, device_indexes=(0, 0)), "device_indexes"),
        (dict(extra={"enable_mixed_chunk": True}), "extra"),
        (dict(extra={"disable_overlap_schedule": True}), "use overlap_schedule"),
        (dict(overlap_schedule=None), "overlap_schedule must be True or False"),
        (dict(overlap_schedule=1), "overlap_schedule must be True or False"),
        (dict(vocab_parallel_sampler=None), "vocab_parallel_sampler must be True or False"),
        (dict(return_routed_experts=1), "return_routed_experts must be True or False"),
        (dict(share_group_prefill="yes"), "share_group_prefill must be True or False"),
        (dict(extra={"enable_return_routed_experts": True}), "use return_routed_experts"),
        (
            dict(return_routed_experts=True, tp_size=2, dp_size=2),
            r"return_routed_experts needs dp_size=1, got dp_size=2",
        ),
        (dict(max_prefill_tokens=10), "max_prefill_tokens"),
        (dict(sampler_modes={"entropy_top_k": 8}), "sampler_modes must be a list"),
        (dict(sampler_modes=[{"entropy_topk": 8}]), r"sampler_modes\[0\] has unknown"),
        (dict(sampler_modes=[{}, {"entropy_top_k": -1}]), r"sampler_modes\[1\]: entropy_top_k"),
        (dict(sampler_modes=[{"penalties": "yes"}]), r"sampler_modes\[0\].penalties"),
        (dict(sampler_modes=[{"logprobs_mode": "tempered"}]), "logprobs_mode"),
    ],
)
def test_bad_settings_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        EngineSettings(**changes)


def test_server_args_force_single_process_and_overlap_follows_its_setting():
    args = EngineSettings(extra={"attention_backend": "native"}).server_args("/m", "cpu")
    for name, value in FORCED.items():
        assert args[name] == value
    assert args["disable_overlap_schedule"] is False  # on by default, as upstream, CPU included
    assert EngineSettings().server_args("/m", "tpu")["disable_overlap_schedule"] is False
    for device in ("cpu", "tpu"):
        off = EngineSettings(overlap_schedule=False).server_args("/m", device)
        assert off["disable_overlap_schedule"] is True
    assert args["model_path"] == "/m" and args["device"] == "cpu"
    assert args["enable_return_routed_experts"] is False  # off unless asked (MoE replay)
    routed = EngineSettings(return_routed_experts=True).server_args("/m", "cpu")
    assert routed["enable_return_routed_experts"] is True
    assert args["attention_backend"] == "native"


def test_replace_rejects_unknown_settings():
    with pytest.raises(ValueError, match="unknown engine setting"):
        EngineSettings().replace(pagesize=2)


def test_sampler_modes_are_kept_and_not_passed_to_sgl_jax():
    settings = EngineSettings(sampler_modes=[{"entropy_top_k": 8, "penalties": True}])
    assert settings.sampler_modes == ({"entropy_top_k": 8, "penalties": True},)
    assert "sampler_modes" not in settings.server_args("/m", "cpu")


def test_the_cpu_attention_gets_one_full_kv_pool():
    """sgl-jax's native (CPU) attention cannot write its sliding-window pool: a model with a
    window gets the full pool there, and keeps upstream's hybrid pool on TPU's kernels."""
    assert EngineSettings().server_args("/m", "cpu")["disable_hybrid_swa_memory"] is True
    native = EngineSettings(attention_backend="native").server_args("/m", "tpu")
    assert native["disable_hybrid_swa_memory"] is True
    assert "disable_hybrid_swa_memory" not in EngineSettings().server_args("/m", "tpu")


def test_a_model_whose_window_layers_keep_their_own_kv_shape_gets_the_hybrid_pool():
    """Gemma 4's windowed layers keep KV of another shape than its full layers: no single pool
    holds both, so even on CPU it gets upstream's hybrid pool (served there through the
    swa_pool_native_attention patch); Gemma 2's layers share one shape and keep the one pool."""
    from sgl_jax_rollout.engine.settings import window_kv_differs

    gemma4 = {"text_config": {"head_dim": 256, "global_head_dim": 512, "num_key_value_heads": 16}}
    fewer_heads = {"head_dim": 128, "num_key_value_heads": 8, "num_global_key_value_heads": 2}
    assert window_kv_differs(gemma4) and window_kv_differs(fewer_heads)
    assert not window_kv_differs({"head_dim": 256, "num_key_value_heads": 4})
    args = EngineSettings().server_args("/m", "cpu", window_kv_differs=True)
    assert "disable_hybrid_swa_memory" not in args


def test_auto_dtype_of_a_multimodal_checkpoint_is_its_top_level_dtype():
    """Gemma 3 4B's text_config names no dtype; sgl-jax would resolve "auto" to float32 from
    it while the trainer loads the checkpoint's bfloat16."""
    from sgl_jax_rollout.engine.settings import served_dtype

    text = {"model_type": "gemma3_text", "hidden_size": 64}
    nested = {"torch_dtype": "bfloat16", "text_config": text}
    assert served_dtype("auto", nested) == "bfloat16"
    assert served_dtype("float32", nested) == "float32"
    assert served_dtype("auto", {**nested, "torch_dtype": None, "dtype": "float16"}) == "float16"
    named = {"torch_dtype": "bfloat16", "text_config": {**text, "torch_dtype": "float32"}}
    assert served_dtype("auto", named) == "float32"
    assert served_dtype("auto", {"torch_dtype": "bfloat16"}) == "auto"  # sgl-jax reads it
    assert served_dtype("auto", {"text_config": text}) == "auto"  # no dtype anywhere


def test_the_resolved_dtype_is_what_the_engine_computes_in():
    """`resolved_dtype` (what `check` builds its trainer in): "auto" resolved from the
    language model's config, float32 where none is named; a named dtype kept."""
    from sgl_jax_rollout.engine.settings import resolved_dtype

    assert resolved_dtype("auto", {"torch_dtype": "bfloat16"}) == "bfloat16"
    assert resolved_dtype("auto", {"dtype": "float16"}) == "float16"
    assert resolved_dtype("auto", {}) == "float32"
    assert resolved_dtype("float32", {"torch_dtype": "bfloat16"}) == "float32"
    text = {"model_type": "gemma3_text"}
    assert resolved_dtype("auto", {"torch_dtype": "bfloat16", "text_config": text}) == "bfloat16"
