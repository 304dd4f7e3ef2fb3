"""The persistent compilation cache: off unless a directory is named; a warm start reads every
program; a program is never read for another model, dtype, mesh or sgl-jax build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_jax_rollout.engine.settings import EngineSettings
from sgl_jax_rollout.utils import compilation_cache
from sgl_jax_rollout.utils.compilation_cache import CACHE_DIR_VAR, UPSTREAM_CACHE_DIR_VAR

ROOT = Path(__file__).resolve().parents[3]
JAX_CACHE_VARS = (
    UPSTREAM_CACHE_DIR_VAR,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
)


@pytest.fixture
def no_cache_variables(monkeypatch):
    for name in (CACHE_DIR_VAR, *JAX_CACHE_VARS):
        monkeypatch.delenv(name, raising=False)


def test_the_cache_is_off_unless_a_directory_is_named(no_cache_variables, monkeypatch, tmp_path):
    assert compilation_cache.cache_root(None) is None
    assert compilation_cache.cache_root(tmp_path / "set") == tmp_path / "set"
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "env"))
    assert compilation_cache.cache_root(None) == tmp_path / "env"
    assert compilation_cache.cache_root(tmp_path / "set") == tmp_path / "set"  # the setting wins


def test_a_bad_cache_directory_is_refused_by_name(no_cache_variables, monkeypatch, tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(ValueError, match="compilation_cache_dir must name a directory"):
        compilation_cache.cache_root(afile)
    with pytest.raises(ValueError, match="--compilation-cache must name a directory"):
        compilation_cache.cache_root(afile, "--compilation-cache")
    monkeypatch.setenv(UPSTREAM_CACHE_DIR_VAR, str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="JAX_COMPILATION_CACHE_DIR .* both name"):
        compilation_cache.cache_root(tmp_path / "cache")
    with pytest.raises(ValueError, match="compilation_cache_dir must be a directory path"):
        EngineSettings(compilation_cache_dir=3)
    assert EngineSettings(compilation_cache_dir=tmp_path).compilation_cache_dir == str(tmp_path)


def test_each_sgl_jax_build_has_its_own_folder(monkeypatch, tmp_path):
    folder = compilation_cache.cache_directory(tmp_path)
    assert folder.parent == tmp_path and "cddbf6f1" in folder.name
    monkeypatch.setattr(compilation_cache, "sgl_jax_build", lambda: "0.0.3.dev0+g12345678")
    assert compilation_cache.cache_directory(tmp_path).name == "sgl-jax-0.0.3.dev0_g12345678"


def test_the_cli_option_turns_the_cache_on_here_and_in_launched_processes(
    no_cache_variables, monkeypatch, tmp_path
):
    from sgl_jax_rollout_apps import cli

    enabled = []
    monkeypatch.setattr(compilation_cache, "enable_compilation_cache", enabled.append)
    cache, model = tmp_path / "cache", tmp_path / "model"
    assert cli.main(["--compilation-cache", str(cache), "make-tiny-model", str(model)]) == 0
    assert enabled == [cache]
    assert os.environ[CACHE_DIR_VAR] == str(cache)  # engines' default, launched processes
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--compilation-cache", str(model / "config.json"), "make-tiny-model", "x"])
    assert exit_info.value.code == 2


@pytest.mark.engine
def test_a_cached_program_is_read_only_for_the_same_model_dtype_mesh_and_sgl_jax(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (CACHE_DIR_VAR, *JAX_CACHE_VARS)}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    done = subprocess.run(
        [sys.executable, "-m", "tests.sgl_jax_rollout.utils.compilation_cache_worker", tmp_path],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    starts = json.loads(done.stdout.strip().splitlines()[-1])
    cold, warm = starts["cold"], starts["warm"]
    assert cold["hits"] == 0 and cold["misses"] > 0, cold
    # Warm: every program the cold start compiled is read back, the model's forward included.
    assert warm["misses"] == 0 and warm["hits"] == cold["misses"], warm
    assert warm["forward_hits"] > 0, warm
    for change in ("dtype", "model", "mesh"):
        start = starts[change]
        assert start["forward_hits"] == 0 and start["misses"] > 0, (change, start)
    other_build = starts["sgl_jax"]
    assert other_build["hits"] == 0 and other_build["folder"] != cold["folder"], other_build
