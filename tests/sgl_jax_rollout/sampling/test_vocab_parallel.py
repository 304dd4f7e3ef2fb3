"""The vocabulary-parallel sampler equals the unsharded one (8 simulated CPU devices, in a
subprocess: tests/sgl_jax_rollout/sampling/vocab_parallel_worker.py).

Every mode (processed / raw logprobs, raw / processed entropy, full and top-k entropy, top
logprobs), penalties from ids and from dense tables, a padded vocabulary, no penalties, the
exact-search rows and a vocabulary large enough for the blocked top-k inside each shard; on
tp = 2, 4, 8 and dp = 2 x tp = 4: the same tokens and top-logprob ids, logprobs, entropy and
top logprobs within 1e-6.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MESHES = ("dp1xtp2", "dp1xtp4", "dp1xtp8", "dp2xtp4")


@pytest.fixture(scope="module")
def report() -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.sgl_jax_rollout.sampling.vocab_parallel_worker"],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_every_case_ran_on_every_mesh(report):
    assert report["devices"] == 8
    names = {case.rsplit(" ", 1)[0] for case in report["cases"]}
    assert len(names) == 12
    for name in names:
        meshes = {case.rsplit(" ", 1)[1] for case in report["cases"] if case.startswith(name + " ")}
        assert meshes == set(MESHES), name


def test_vocab_parallel_equals_unsharded_sampler(report):
    for case, diff in report["cases"].items():
        assert diff["tokens_equal"], case
        assert diff.get("top_ids_equal", True), case
        for field in ("logprobs", "entropy", "top_logprobs"):
            assert diff.get(field, 0.0) <= 1e-6, (case, field, diff[field])
