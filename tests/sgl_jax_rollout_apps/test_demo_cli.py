"""`sgl-jax-rollout demo` argument handling (the training itself is in the training tests)."""

import sys

import pytest

from sgl_jax_rollout_apps.cli import main
from sgl_jax_rollout_apps.commands.demo import _run_size_fields
from sgl_jax_rollout_apps.demo import DemoConfig


def test_missing_engine_gives_the_install_command_and_exit_2(monkeypatch, capsys):
    # as if sgl-jax (and zmq, which comes with it) were not installed
    monkeypatch.setitem(sys.modules, "sgl_jax", None)
    monkeypatch.setitem(sys.modules, "zmq", None)
    for name in [m for m in sys.modules if m.startswith("sgl_jax_rollout.engine")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["demo", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and "sglang-jax" in err and "Traceback" not in err


def test_preset_of_another_slice_exits_2_naming_the_device_count(capsys):
    assert main(["demo", "--preset", "v5e-8"]) == 2  # this process sees one device
    err = capsys.readouterr().err
    assert "needs devices: 8" in err and "jax.device_count()" in err and "Traceback" not in err
    assert main(["demo", "--preset", "v9-1"]) == 2
    assert "unknown preset 'v9-1'; presets: cpu-2host, cpu-debug" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"algo": "dpo"}, "algo"),
        ({"steps": 0}, "steps"),
        ({"num_generations": 1}, "num_generations"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"over_sampling_batch_size": 4, "rollout": "vanilla"}, "over_sampling_batch_size"),
        ({"partial_rollout": True, "algo": "ppo"}, "partial_rollout"),
        ({"filter_groups": "verl", "algo": "ppo"}, "filter_groups"),
        ({"filter_groups": "dapo"}, "filter_groups"),
        ({"filter_groups": "verl", "rollout": "vanilla"}, "need the sglang_jax rollout"),
        ({"filter_groups": "verl", "task": "arithmetic", "rollout": "both"}, "sglang_jax"),
        ({"model": "gemma-7b"}, "model must be one of smollm2-135m-instruct, gemma3-270m"),
        ({"model": "gemma3-270m", "model_path": "/m"}, "model and model_path"),
        ({"task": "arithmetic", "prompt_style": "zero-shot"}, "prompt_style must be one of"),
        ({"learner": "mcts"}, "learner must be one of"),
        ({"tools": "calculator"}, "tools applies to learner='agentic'"),
        ({"off_policy_steps": 1}, "off_policy_steps applies to learner='agentic'"),
        ({"learner": "agentic", "algo": "ppo"}, "algo 'grpo'"),
        ({"learner": "agentic", "tools": "calculator"}, "needs task='arithmetic'"),
        ({"learner": "agentic", "task": "arithmetic", "tools": "abacus"}, "tools must be"),
        ({"learner": "agentic", "off_policy_steps": -1}, "off_policy_steps must be >= 0"),
        ({"learner": "agentic", "max_concurrency": 0}, "max_concurrency must be >= 1"),
        ({"learner": "agentic", "tis_cap": 2.0}, "tis_cap does not apply"),
        ({"learner": "agentic", "filter_groups": "verl"}, "do not apply to learner='agentic'"),
        ({"train_micro_batch_size": 3}, "train_micro_batch_size must be >= 1 and divide"),
        ({"train_micro_batch_size": 0}, "train_micro_batch_size must be >= 1"),
    ],
)
def test_bad_demo_settings_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DemoConfig(**kwargs)


def test_a_real_checkpoints_task_defaults_sit_between_the_tasks_and_the_flags():
    import argparse

    from sgl_jax_rollout_apps.commands.demo import add_parser
    from sgl_jax_rollout_apps.demo_config import TASK_DEFAULTS

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), presets="")
    fields = _run_size_fields(parser.parse_args(["demo", "--task", "arithmetic"]))
    assert fields == TASK_DEFAULTS
    args = ["demo", "--task", "arithmetic", "--model", "gemma3-270m", "--steps", "7"]
    fields = _run_size_fields(parser.parse_args(args))
    assert fields == {**TASK_DEFAULTS, "steps": 7, "eval_every": 5, "learning_rate": 1e-5}


def test_tool_episodes_take_longer_turns_unless_the_flag_says():
    import argparse

    from sgl_jax_rollout_apps.commands.demo import TOOL_TURN_TOKENS, add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), presets="")
    agentic = ["demo", "--learner", "agentic", "--task", "arithmetic", "--tools", "calculator"]
    assert _run_size_fields(parser.parse_args(agentic))["max_tokens"] == TOOL_TURN_TOKENS
    assert _run_size_fields(parser.parse_args([*agentic, "--max-tokens", "30"]))["max_tokens"] == 30


def test_a_train_micro_batch_sets_the_mini_batch_tunix_requires_with_it():
    from sgl_jax_rollout_apps.demo import _train_batches

    assert _train_batches(DemoConfig(), 4) == {
        "mini_batch_size": None,
        "train_micro_batch_size": None,
    }
    two = DemoConfig(train_micro_batch_size=2)
    assert _train_batches(two, 4) == {"mini_batch_size": 4, "train_micro_batch_size": 2}
    mini = DemoConfig(mini_batch_size=2, train_micro_batch_size=1)
    assert _train_batches(mini, 4) == {"mini_batch_size": 2, "train_micro_batch_size": 1}


def test_bad_cli_values_exit_2_without_traceback(capsys):
    assert main(["demo", "--steps", "0", "--rollout", "vanilla"]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err


def test_compare_against_vllm_off_tpu_exits_2(capsys):
    assert main(["compare", "--against", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "needs a TPU" in err and "--against vanilla" in err and "Traceback" not in err


def test_compare_bad_values_exit_2(capsys):
    assert main(["compare", "--against", "vanilla", "--steps", "0"]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err


def test_chat_prompts_on_a_checkpoint_without_a_chat_template_exit_2_before_training(
    tmp_path, capsys
):
    """The tokenizer is read before the cluster is built: no engine, no trainer, no weights."""
    import json
    import shutil

    from sgl_jax_rollout.tiny_model import default_model_dir

    source = default_model_dir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert not (tmp_path / "chat_template.jinja").exists()
    argv = ["demo", "--task", "arithmetic", "--model-path", str(tmp_path), "--rollout", "vanilla"]
    assert main([*argv, "--prompt-style", "chat", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "demo --prompt-style: prompt_style 'chat' needs a tokenizer with a chat template" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
