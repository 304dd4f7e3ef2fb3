"""tpu_configs: every preset loads and validates; errors name the field; meshes on 8
simulated CPU devices (in a subprocess, as XLA_FLAGS must be set before jax starts)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tpu_configs
from tpu_configs import PresetError

REQUIRED = {"cpu-debug", "cpu-2host", "v5e-1", "v5e-4", "v5e-8", "v5p-8", "v6e-8", "v5p-64"}
ROOT = Path(__file__).resolve().parents[2]


def test_required_presets_exist_and_fill_their_devices():
    assert set(tpu_configs.names()) >= REQUIRED
    for name in tpu_configs.names():
        p = tpu_configs.load(name)
        assert p.name == name and p.description and p.models
        assert p.trainer_fsdp * p.trainer_tp == p.trainer_devices
        if p.hosts > 1:  # the trainer spans every host; each host runs an engine of its own
            assert p.shared_devices and p.trainer_devices == p.devices
            assert p.rollout_dp == 1 and p.rollout_devices <= p.devices // p.hosts
            assert p.rollout_device_ids() == tuple(range(p.rollout_devices))  # local positions
        elif p.shared_devices:
            assert p.trainer_devices == p.rollout_devices == p.devices
            assert p.rollout_device_ids() == tuple(range(p.devices))
        else:
            assert p.trainer_devices + p.rollout_devices == p.devices
            assert p.rollout_device_ids() == tuple(range(p.trainer_devices, p.devices))
        settings = p.engine_settings()
        assert (settings.tp_size, settings.dp_size) == (p.rollout_devices, p.rollout_dp)
        assert settings.max_running_requests >= p.rollout_micro_batch_size
        if p.slice != "cpu":
            args = settings.server_args("/m", "tpu")
            assert args["dtype"] == "bfloat16" and args["attention_backend"] == "fa"
            assert 0 < args["mem_fraction_static"] < 1 and args["max_total_tokens"] is None
            assert args["page_size"] > 1 and args["chunked_prefill_size"] > 0


def test_slices_have_their_device_counts():
    devices = {n: tpu_configs.load(n).devices for n in REQUIRED}
    # v5p names count TensorCores (2 per chip); JAX sees chips.
    assert devices == {
        "cpu-debug": 1,
        "cpu-2host": 8,
        "v5e-1": 1,
        "v5e-4": 4,
        "v5e-8": 8,
        "v5p-8": 4,
        "v6e-8": 8,
        "v5p-64": 32,
    }
    assert tpu_configs.load("v5p-64").hosts == 8
    v5p_64 = tpu_configs.load("v5p-64")
    assert v5p_64.engine_settings().device_indexes is None  # each host's from its rollout mesh
    assert (v5p_64.rollout_dp, v5p_64.rollout_tp) == (1, 4)  # one host's 4 chips
    assert tpu_configs.load("cpu-2host").hosts == 2


def test_overrides_merge_into_the_preset():
    p = tpu_configs.load(
        "v5e-8",
        engine={"page_size": 128, "mem_fraction_static": 0.5},
        rollout_mesh={"dp": 2, "tp": 4},
        rollout_micro_batch_size=16,
    )
    assert (p.engine.page_size, p.engine.mem_fraction_static) == (128, 0.5)
    assert p.engine.dtype == "bfloat16"  # the rest stays
    assert (p.rollout_dp, p.rollout_tp, p.rollout_micro_batch_size) == (2, 4, 16)
    assert tpu_configs.load("v5e-8").engine.page_size == 64  # the file is not changed


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpus": 8}, "unknown preset field 'gpus'"),
        ({"trainer_mesh": {"fsdp": 4, "tp": 1}}, r"trainer_mesh fsdp x tp = 4 must equal devices"),
        ({"rollout_mesh": {"dp": 1, "tp": 3}}, r"rollout_mesh.tp \(3\) must divide the device"),
        ({"rollout_mesh": {"pp": 2}}, "rollout_mesh must have exactly the keys"),
        ({"devices": 0}, "devices must be an integer >= 1"),
        ({"shared_devices": "yes"}, "shared_devices must be true or false"),
        ({"engine": {"mem_fraction_static": 1.2}}, r"mem_fraction_static must be in \(0, 1\)"),
        ({"engine": {"precompile_token_paddings": [4096, 1024]}}, "strictly increasing"),
        ({"engine": {"precompile_bs_paddings": [8, 16]}}, "must cover max_running_requests"),
        (
            {"engine": {"precompile_token_paddings": [512, 1024]}},
            r"precompile_token_paddings must cover one prefill step \(4096 tokens",
        ),
        ({"rollout_micro_batch_size": 512}, r"max_running_requests \(256\) must cover"),
        ({"engine": {"tp_size": 8}}, "engine.tp_size comes from the meshes"),
        ({"engine": {"dtype": "int4"}}, "dtype must be one of"),
        ({"engine": {"attention_backend": "flash"}}, "attention_backend must be one of"),
        ({"engine": {"warp": 1}}, r"unknown engine setting\(s\) \['warp'\]"),
        (
            {"shared_devices": False},
            r"trainer \(8\) plus rollout \(8\) devices must equal devices \(8\)",
        ),
    ],
)
def test_bad_values_raise_naming_the_field(overrides, message):
    with pytest.raises(PresetError, match=message):
        tpu_configs.load("v5e-8", **overrides)


def test_multi_host_and_dp_rules():
    with pytest.raises(PresetError, match="shared_devices must be true on a multi-host"):
        tpu_configs.load(
            "v5p-64",
            shared_devices=False,
            trainer_mesh={"fsdp": 16, "tp": 1},
            rollout_mesh={"dp": 2, "tp": 8},
        )
    with pytest.raises(PresetError, match=r"multiple of rollout_mesh.dp \(2\)"):
        tpu_configs.load(
            "v5e-8",
            rollout_mesh={"dp": 2, "tp": 4},
            engine={"max_running_requests": 255, "precompile_bs_paddings": [256]},
        )
    with pytest.raises(PresetError, match=r"rollout_mesh dp x tp = 8 must fit on one host \(4"):
        tpu_configs.load("v5p-64", rollout_mesh={"dp": 1, "tp": 8})
    with pytest.raises(PresetError, match=r"rollout_mesh.dp must be 1 on several hosts, got 2"):
        tpu_configs.load("v5p-64", rollout_mesh={"dp": 2, "tp": 2})
    with pytest.raises(PresetError, match="unknown preset 'v7-8'"):
        tpu_configs.load("v7-8")


def test_device_count_is_checked_with_a_clear_message():
    tpu_configs.load("v5e-8").check_devices(8)
    with pytest.raises(PresetError, match=r"needs devices: 8 .* sees 4 \(jax.device_count\(\)\)"):
        tpu_configs.load("v5e-8").check_devices(4)
    with pytest.raises(PresetError, match=r"jax.distributed.initialize\(\)"):
        tpu_configs.load("v5p-64").check_devices(4)
    tpu_configs.load("v5p-64").check_devices(32, processes=8)
    tpu_configs.load("cpu-2host").check_devices(8, processes=1)  # the single-process run
    with pytest.raises(PresetError, match=r"hosts: 8, but this process is one of 2 JAX"):
        tpu_configs.load("v5p-64").check_devices(32, processes=2)
    tpu_configs.load("cpu-debug").check_devices()  # this process: one CPU device


def test_tp_must_divide_the_models_kv_heads(tiny_dir, tmp_path):
    tpu_configs.load("cpu-debug").check_model(tiny_dir)  # 2 kv heads, tp 1
    tpu_configs.load("v5p-8", rollout_mesh={"dp": 2, "tp": 2}).check_model(tiny_dir)
    with pytest.raises(
        PresetError, match=r"rollout_mesh.tp \(8\) must divide the model's kv heads \(2"
    ):
        tpu_configs.load("v5e-8", trainer_mesh={"fsdp": 4, "tp": 2}).check_model(tiny_dir)
    with pytest.raises(PresetError, match=r"trainer_mesh.tp \(4\) must divide"):
        tpu_configs.load("v5p-64").check_model(tiny_dir)
    mha = tmp_path / "mha"
    mha.mkdir()
    (mha / "config.json").write_text(json.dumps({"num_attention_heads": 8}))
    tpu_configs.load("v5e-8").check_model(mha)  # no num_key_value_heads: kv heads = heads


MESHES = """
import json, tpu_configs
out = {}
dp2 = {"rollout_mesh": {"dp": 2, "tp": 4}}
for name, overrides in (("v5e-8", {}), ("v6e-8", {}), ("v5e-8", dp2), ("cpu-2host", {})):
    p = tpu_configs.load(name, **overrides)
    trainer, rollout = p.meshes()
    out[name + str(overrides)] = {
        "trainer": [dict(trainer.shape), [d.id for d in trainer.devices.flat]],
        "rollout": [dict(rollout.shape), [d.id for d in rollout.devices.flat]],
    }
print(json.dumps(out))
"""


def test_meshes_on_eight_simulated_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", MESHES], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["v5e-8{}"] == {
        "trainer": [{"fsdp": 8, "tp": 1}, list(range(8))],
        "rollout": [{"data": 1, "tensor": 8}, list(range(8))],
    }
    assert got["v6e-8{}"] == {
        "trainer": [{"fsdp": 4, "tp": 1}, [0, 1, 2, 3]],
        "rollout": [{"data": 1, "tensor": 4}, [4, 5, 6, 7]],
    }
    # one process with the simulated pod's 8 devices: the engine on the first host's first two
    assert got["cpu-2host{}"] == {
        "trainer": [{"fsdp": 4, "tp": 2}, list(range(8))],
        "rollout": [{"data": 1, "tensor": 2}, [0, 1]],
    }
    assert got["v5e-8{'rollout_mesh': {'dp': 2, 'tp': 4}}"]["rollout"][0] == {
        "data": 2,
        "tensor": 4,
    }
