"""One engine per simulated host (engine-marked): `sgl-jax-rollout launch` runs two JAX
processes of 4 CPU devices each (tests/sgl_jax_rollout/engine/per_host_worker.py); each builds
an engine on its own 4 devices (tp = 4, the sampler vocabulary-parallel) inside the 8-device
JAX system, and both generate the session engine's greedy tokens and logprobs (one device, one
process). Both must start together: sgl-jax's start-up memory probe is a collective over every
process's devices when there are several (`get_available_device_memory(distributed=True)`).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sgl_jax_rollout.tunix_compat import RolloutConfig
from tests.sgl_jax_rollout.engine.per_host_worker import PROMPTS

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[3]


def test_an_engine_per_host_serves_the_single_process_engines_tokens(tiny_dir, rollout):
    done = subprocess.run(
        [sys.executable, "-m", "sgl_jax_rollout_apps.cli", "launch", "--processes", "2"]
        + ["--devices-per-process", "4", "--timeout", "900", "--"]
        + [sys.executable, "-m", "tests.sgl_jax_rollout.engine.per_host_worker", str(tiny_dir)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=1000,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    results = {}
    for line in done.stdout.splitlines():
        rank, _, text = line.partition(" ")
        if text.startswith("RESULT "):
            results[rank] = json.loads(text[len("RESULT ") :])
    assert sorted(results) == ["[p0]", "[p1]"]
    config = RolloutConfig(max_tokens_to_generate=8, seed=0, return_logprobs=True)
    want = rollout.generate(PROMPTS, config, temperature=0.0)
    for result in results.values():
        assert (result["processes"], result["devices"]) == (2, 8)
        assert result["engine_devices"] == result["local_devices"]  # its own 4 devices only
        assert result["vocab_parallel"]
        assert result["tokens"] == [[int(t) for t in row] for row in want.tokens]
        for got, expected in zip(result["logprobs"], want.logprobs, strict=True):
            np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    assert results["[p0]"]["local_devices"] != results["[p1]"]["local_devices"]
