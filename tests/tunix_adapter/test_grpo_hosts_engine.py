"""GRPO on a simulated pod (engine-marked): the demo on the `cpu-2host` preset as two JAX
processes of 4 CPU devices (`sgl-jax-rollout launch`), each with its own engine on its first 2
devices sampling half of every step's prompts, the trainer spanning all 8 devices; against the
same preset in one process with 8 devices, whose one engine samples every prompt
(tests/tunix_adapter/grpo_hosts_worker.py prints what each process sampled).

Same seeds, so the same prompts in every step, and at step 0 (the same weights in both runs)
the same tokens and rewards in every row, logprobs within 5e-6: the engines batch different
rows (8 against 16), and overlap scheduling's extra step for a finished request changes a
batch's rows, which moves the model's forward by a few float32 ulps (1.4e-6 measured; see
tests/sgl_jax_rollout/test_overlap_engine.py).

Later steps sample with weights trained across two processes, whose gradient sums (over gloo)
round differently from one process's, so logprobs agree to 2e-4, not bit for bit, and now and
then a row's draw falls on the other side of a CDF boundary (measured: 1 row of 48, at its 6th
token, logprobs 1.3e-5 apart before it). Each row's tokens are then equal up to where the two
runs part, and where they do, the two tokens are neighbours in the vocabulary: the demo samples
at T = 1 over the whole vocabulary by inverse CDF in id order with one uniform per row, so the
same seed lands on the next id. A seed or row mismatch gives unrelated tokens from the first.
At most one row in eight may part.

In both runs, every process's trainer scores its own rows within 1e-4 of its rollout at every
step: weights synced across hosts, rows kept aligned.

The run keeps forking tokens (`top_entropy_quantile=0.5`): the entropy threshold is the global
batch's in every process (TRL gathers across ranks first), so at step 0 both hosts report the
one-process threshold and together keep the tokens it keeps.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
WORKER = [sys.executable, "-m", "tests.tunix_adapter.grpo_hosts_worker", str(STEPS)]


def _results(command: list[str], env: dict[str, str]) -> dict[str, dict]:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1000)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            results["single"] = json.loads(line[len("RESULT ") :])
        rank, _, text = line.partition(" ")
        if text.startswith("RESULT "):
            results[rank] = json.loads(text[len("RESULT ") :])
    return results


def test_grpo_on_two_simulated_hosts_matches_one_process():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    hosts = _results(
        [sys.executable, "-m", "sgl_jax_rollout_apps.cli", "launch", "--processes", "2"]
        + ["--devices-per-process", "4", "--timeout", "900", "--"]
        + WORKER,
        env,
    )
    single_env = dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    single = _results(WORKER, single_env)["single"]
    assert sorted(hosts) == ["[p0]", "[p1]"]
    p0, p1 = hosts["[p0]"], hosts["[p1]"]
    assert (p0["processes"], p0["devices"], single["processes"], single["devices"]) == (2, 8, 1, 8)
    # each host's engine on its own first two devices (process 1's CPU ids start at 2048)
    assert (p0["engine_devices"], p1["engine_devices"], single["engine_devices"]) == (
        [0, 1],
        [2048, 2049],
        [0, 1],
    )
    assert len(single["steps"]) == len(p0["steps"]) == len(p1["steps"]) == STEPS
    for step in range(STEPS):
        want = single["steps"][step]
        got = p0["steps"][step] + p1["steps"][step]  # process 0's share first
        assert len(got) == len(want) == 16  # 4 prompts x 4 generations
        assert [r["prompt"] for r in got] == [r["prompt"] for r in want]
        parted = 0
        for g, w in zip(got, want, strict=True):
            same = _common_prefix(g["tokens"], w["tokens"])
            if same < max(len(g["tokens"]), len(w["tokens"])):
                assert step > 0, f"step 0 rows part at token {same}"
                assert same < min(len(g["tokens"]), len(w["tokens"])), (step, g, w)
                assert abs(g["tokens"][same] - w["tokens"][same]) == 1, (step, same, g, w)
                parted += 1
            else:
                assert g["reward"] == w["reward"]
            np.testing.assert_allclose(
                g["logprobs"][:same],
                w["logprobs"][:same],
                atol=5e-6 if step == 0 else 2e-4,
                rtol=0,
            )
        assert parted <= len(got) // 8, parted
    # the groups differ between the two hosts: each sampled its own share
    assert p0["steps"][0] != p1["steps"][0]
    # forking tokens over the global batch: one threshold, the one-process run's at step 0
    assert p0["forking_threshold"] == p1["forking_threshold"]
    assert p0["forking_threshold"][0] == pytest.approx(single["forking_threshold"][0], abs=1e-5)
    kept = p0["forking_kept"][0] + p1["forking_kept"][0]
    assert abs(kept - single["forking_kept"][0]) <= 1, (p0, p1, single)
    for result in (p0, p1, single):
        assert len(result["logp_diff_max"]) == STEPS
        assert max(result["logp_diff_max"]) <= 1e-4, result["logp_diff_max"]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
