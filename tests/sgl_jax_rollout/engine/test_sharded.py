"""The engine sharded over simulated devices (engine-marked; 8 CPU devices, each engine in
its own subprocess: tests/sgl_jax_rollout/engine/sharded_worker.py).

- tp = 2 and dp = 2 x tp = 2 give the tokens, logprobs and entropy of tp = 1 (<= 1e-4),
  greedy and seeded sampling, with the sampler running vocabulary-parallel (its default);
- `update_params` with trainer weights laid out fsdp = 4 x tp = 2 over all 8 devices lands
  every leaf on the engine's own sharding, split across the engine's devices (no full copy
  on one device: per-leaf shard sizes, and the mapping program's per-device memory), and the
  swapped engine's logprobs equal the trainer's own on those weights and tp = 1's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[3]
_cache: dict[tuple, dict] = {}


@pytest.fixture(scope="module")
def run(tiny_dir):
    def run(tp: int, dp: int, swap: bool = False) -> dict:
        key = (tp, dp, swap)
        if key not in _cache:
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            args = [
                sys.executable,
                "-m",
                "tests.sgl_jax_rollout.engine.sharded_worker",
                str(tiny_dir),
                str(tp),
            ]
            args += [str(dp)] + (["swap"] if swap else [])
            done = subprocess.run(
                args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
            )
            lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            assert done.returncode == 0 and lines, done.stderr[-3000:]
            _cache[key] = json.loads(lines[-1][len("RESULT ") :])
        return _cache[key]

    return run


def assert_same_generation(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"]
    for field in ("logprobs", "entropy"):
        for x, y in zip(a[field], b[field], strict=True):
            np.testing.assert_allclose(x, y, atol=1e-4, rtol=0)


def test_tp2_matches_tp1(run):
    one, two = run(1, 1, swap=True), run(2, 1, swap=True)
    assert one["devices"] == two["devices"] == 8
    assert two["vocab_parallel"] and not one["vocab_parallel"]
    assert all(len(leaf["devices"]) == 2 for leaf in two["engine"])
    assert any(leaf["largest_shard"] < leaf["size"] for leaf in two["engine"])
    assert all(len(row) == 16 for row in one["before"]["tokens"])
    assert_same_generation(one["before"], two["before"])
    assert_same_generation(one["sampled"], two["sampled"])


def test_dp2_tp2_matches_tp1(run):
    """dp = 2 x tp = 2 (4 devices): requests land on both dp ranks (4 greedy, then 8 seeded
    samples with top-k and a repetition penalty, so every row's own settings matter)."""
    one, dp = run(1, 1, swap=True), run(4, 2)
    assert dp["vocab_parallel"]
    assert all(len(leaf["devices"]) == 4 for leaf in dp["engine"])
    assert len(dp["sampled"]["tokens"]) == 8
    assert_same_generation(one["before"], dp["before"])
    assert_same_generation(one["sampled"], dp["sampled"])


def test_update_params_reshards_fsdp4_tp2_weights_onto_the_tp2_engine(run):
    two = run(2, 1, swap=True)
    # the trainer's leaves are split over all 8 devices
    assert all(len(leaf["devices"]) == 8 for leaf in two["trainer"])
    assert all(leaf["largest_shard"] < leaf["size"] for leaf in two["trainer"])
    # moved to the engine's 2 devices split, and swapped in with the engine's own shardings
    for leaf in two["program"]["moved"]:
        assert leaf["devices"] == [0, 1] and leaf["largest_shard"] * 2 == leaf["size"]
    assert two["same_shardings"]
    assert two["swapped"] == two["engine"]
    # the mapping program never holds a full copy on one device
    program = two["program"]
    assert program["temp_bytes"] + program["output_bytes"] < program["full_copy_bytes"]
    # new weights took effect, and give the trainer's own logprobs and tp = 1's generation
    assert two["after"]["tokens"] != two["before"]["tokens"]
    for i, row in enumerate(two["after"]["logprobs"]):
        np.testing.assert_allclose(row, two["trainer_logprobs"][i][: len(row)], atol=1e-4)
    assert_same_generation(two["after"], run(1, 1, swap=True)["after"])
