"""Overlap scheduling changes nothing a request gets (engine-marked): for seeded requests,
penalties and min_new_tokens included, an engine with overlap on (in a subprocess,
tests/sgl_jax_rollout/engine/overlap_worker.py) gives the tokens of the session engine, whose
default is off on CPU and on elsewhere (so off here is compared with on and the other way
round), and the logprobs and entropy within 1e-5. Not 1e-6: the two engines batch differently
(one request per batch against up to ten, prefill split by arrival time), and the model's
forward in another batch bucket differs by a few float32 ulps (measured up to 3.6e-6 on logprobs
of magnitude 1 to 5); the sampler adds nothing to that. A wrong step count or penalty table
changes tokens.

On CPU the overlapped engine runs one request at a time: with several per batch, the pinned
sgl-jax gives wrong logits to all but the first request of a batch in about half of its
starts with overlap on (`settings.CPU_OVERLAP_DEFECT`; the engine as it ships does the same).
One request per batch still has everything overlap changes for us: a step built before the
last token is known (penalty tables, min_new_tokens and the PRNG step read from the slot
state), and a finished request's extra step. Batches mixing joining and running slots are
covered by tests/sgl_jax_rollout/engine/test_slot_state.py.

It runs on the session rollout of tests/conftest.py, which orders it after the tests that start
their own engines and before the test that shuts the session engine down.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.sgl_jax_rollout.engine.overlap_worker import CASES, workload

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]


def test_overlap_on_and_off_give_the_same_completions(rollout, tiny_dir):
    cpu = jax.default_backend() == "cpu"
    mine = workload(rollout)
    assert mine["overlap"] is (not cpu)
    other = "on" if cpu else "off"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = [
        sys.executable,
        "-m",
        "tests.sgl_jax_rollout.engine.overlap_worker",
        str(tiny_dir),
        other,
    ]
    args += ["single"] if cpu else []
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    theirs = json.loads(lines[-1][len("RESULT ") :])
    assert theirs["overlap"] is cpu
    for name in CASES:
        assert mine[name]["tokens"] == theirs[name]["tokens"], name
        for field in ("logprobs", "entropy"):
            for a, b in zip(mine[name][field], theirs[name][field], strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=name)
    assert min(len(t) for t in mine["min_new_tokens"]["tokens"]) >= 12
    # Some requests finished (EOS) while others went on: the overlapped finished-request step.
    assert any(min(len(t) for t in mine[name]["tokens"]) < 20 for name in CASES)
