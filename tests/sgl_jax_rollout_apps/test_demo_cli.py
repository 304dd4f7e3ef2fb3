"""`sgl-jax-rollout demo` argument handling (the training itself is in the training tests)."""

import sys

import pytest

from sgl_jax_rollout_apps.cli import main
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
    ],
)
def test_bad_demo_settings_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DemoConfig(**kwargs)


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
