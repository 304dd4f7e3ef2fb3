"""The memory plan (`tunix_adapter.memory_plan`, `sgl-jax-rollout plan`).

Without an engine: the parameter count from a config equals the checkpoint's own (safetensors
headers) for every dense family replica, and matches the Qwen3 model cards' figures for the
real configs (1.7B: 1.7B total, 1.4B non-embedding; 8B: 8.2B and 6.95B); on a v5e-8 the KV
pool is what `mem_fraction_static` leaves once the resident weights are counted; the CLI exits
1 where nothing fits. With the engine (engine-marked): on the CPU preset the plan's engine
weights and KV pool are the bytes of the engine's live arrays, exactly, and after one GRPO
step the trainer's arrays are the plan's actor and Adam state within 10%.
"""

from __future__ import annotations

import json

import pytest

from tunix_adapter.memory_plan import GiB, _Shape, parameter_count, plan

QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, torch_dtype="bfloat16")
QWEN3_1_7B = dict(
    QWEN3,
    hidden_size=2048,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    intermediate_size=6144,
    tie_word_embeddings=True,
)
QWEN3_8B = dict(
    QWEN3,
    hidden_size=4096,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=12288,
    tie_word_embeddings=False,
)


def config_dir(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    "like", ["qwen3-0.6b", "qwen3-8b", "qwen2.5-1.5b-instruct", "llama-3.1-8b"]
)
def test_the_config_count_is_the_checkpoints(like, tmp_path):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    model_dir = make_tiny_model(tmp_path / like, like=like)
    config = json.loads((model_dir / "config.json").read_text())
    assert _Shape.of(config).params() == parameter_count(model_dir, config)


@pytest.mark.parametrize(
    ("config", "total", "non_embedding"), [(QWEN3_1_7B, 1.7e9, 1.4e9), (QWEN3_8B, 8.2e9, 6.95e9)]
)
def test_the_real_qwen3_configs_count_as_their_model_cards(config, total, non_embedding):
    shape = _Shape.of(config)
    embedding = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    assert abs(shape.params() - total) / total < 0.02
    assert abs(shape.params() - embedding - non_embedding) / non_embedding < 0.02


def test_a_v5e_8_kv_pool_is_what_the_fraction_leaves(tmp_path):
    import tpu_configs

    preset = tpu_configs.load("v5e-8")
    result = plan(config_dir(tmp_path, QWEN3_1_7B), preset, batch=32, seq_len=4096)
    params = _Shape.of(QWEN3_1_7B).params()
    assert result.chip_bytes == 16 * GiB
    assert result.engine["weights"] == params * 2 // 8
    resident = result.trainer["actor"] + result.trainer["reference"] + result.engine["weights"]
    cell = 28 * 2 * 1 * 128 * 2  # 8 kv heads over tp 8: one per device
    left = int(16 * GiB * 0.35) - resident
    assert result.engine["KV pool"] == left // cell * cell
    assert result.trainer["optimizer (Adam)"] == 2 * params * 2 // 8
    assert result.peaks["KV released"] < result.peaks["kept"]


def test_a_multimodal_checkpoint_is_planned_by_its_language_model(tmp_path):
    """Gemma 3 4B: the sizes from its text_config (filled as transformers fills it: the 4B's
    names no head count or head_dim), the parameters its language model's tensors only (the
    vision tower and projector are loaded by neither side). Before, `plan` stopped at a
    missing top-level key."""
    import math

    from safetensors import safe_open

    import tpu_configs
    from sgl_jax_rollout.tiny_model import make_tiny_model

    model_dir = make_tiny_model(tmp_path / "g3mm", like="gemma-3-4b-it")
    config = json.loads((model_dir / "config.json").read_text())
    with safe_open(str(model_dir / "model.safetensors"), "numpy") as f:
        names = f.keys()  # a safetensors file, not a dict
        sizes = {k: math.prod(f.get_slice(k).get_shape()) for k in names}
    language = sum(n for k, n in sizes.items() if k.startswith("language_model.model."))
    assert parameter_count(model_dir, config) == language < sum(sizes.values())
    result = plan(model_dir, tpu_configs.load("v5e-8"), batch=2, seq_len=256)
    assert result.engine["weights"] == language * 2 // 8  # bfloat16 over tp 8
    cell = 6 * 2 * 1 * 256 * 2  # 6 layers, 2 KV heads over tp 8: one a device, head_dim 256
    assert result.engine["KV pool"] % cell == 0


def test_the_cli_exits_1_where_nothing_fits(tmp_path, capsys):
    from sgl_jax_rollout_apps.cli import main

    model = str(config_dir(tmp_path, QWEN3_8B))
    assert main(["plan", "--model-path", model, "--preset", "v5e-1"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    fits = ["plan", "--model-path", model, "--preset", "v5p-64", "--seq-len", "2048", "--json"]
    assert main(fits) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["chip_bytes"] == 95 * GiB and printed["fits"]["kept"] is not None


@pytest.mark.engine
def test_the_engine_figures_are_its_live_arrays_on_cpu(tiny_dir):
    import tpu_configs
    from sgl_jax_rollout.rollout import SglangJaxRollout

    preset = tpu_configs.load("cpu-debug")
    expected = plan(tiny_dir, preset, batch=4, seq_len=64).engine
    rollout = SglangJaxRollout(model_path=tiny_dir, engine_settings=preset.engine_settings())
    try:
        freed = rollout.release_memory(weights=True)
    finally:
        rollout.shutdown()
    assert (expected["weights"], expected["KV pool"]) == (
        freed["weight_bytes"],
        freed["kv_bytes"],
    )


@pytest.mark.engine
def test_the_trainer_figures_hold_after_one_step(tiny_dir):
    import jax
    from flax import nnx

    import tpu_configs
    from sgl_jax_rollout_apps import demo

    config = demo.DemoConfig(steps=1, preset="cpu-debug", model_path=str(tiny_dir))
    cluster, learner = demo.build(config)
    try:
        demo.train(config, cluster, learner, shutdown=False)
        trainer = cluster.actor_trainer
        held = sum(
            x.nbytes
            for x in jax.tree_util.tree_leaves(
                (nnx.state(trainer.model, nnx.Param), nnx.state(trainer.optimizer))
            )
            if hasattr(x, "nbytes")
        )
    finally:
        demo._shutdown(cluster)
    expected = plan(
        tiny_dir, tpu_configs.load("cpu-debug"), batch=4, seq_len=64, with_reference=False
    ).trainer
    planned = expected["actor"] + expected["optimizer (Adam)"]
    assert abs(held - planned) <= 0.1 * planned, (held, planned)
