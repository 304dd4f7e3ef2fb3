"""Overlap scheduling changes nothing a request gets (engine-marked): for seeded requests,
penalties and min_new_tokens included, the session engine (overlap on, the default) gives the
tokens of an engine with overlap off (in a subprocess,
tests/sgl_jax_rollout/engine/overlap_worker.py); a wrong step count or penalty table under
overlap changes tokens. Both engines batch the same five prompts (n = 2 for two of the cases:
ten requests per batch). Where no request finishes before the others, both run the same
batches and the logprobs and entropy are bitwise equal. Where one ends by a stop token,
upstream's overlap runs it one step more (its extra step: the token was not known when that
step was built), so one step's batch has a row more than without
overlap, and the model's forward on CPU differs in the last float32 bits for the other rows
from there on (measured over runs: up to 2.9e-6 on logprobs, 3.3e-6 on entropy): those cases
are held to 5e-6. The sampler adds nothing to that.

The session engine runs the workload with its `cache_loc` host buffer moved to a 64-byte
aligned array: the alignment at which JAX's CPU client aliases the buffer instead of copying
it, so that without `patches.cache_loc_copied` every request but the first of a batch would
attend over the next step's KV slots (in about half of all engine starts otherwise, depending
on where numpy put the buffer).

With overlap the forward thread can queue step t + 1 while step t computes only if it never
waits for step t's outputs: they must reach the scheduler as device arrays (their host copies in
flight), with no logprobs left for upstream to copy on that thread. And requests whose token in
flight is their last by length get no step after it (`patches.no_step_after_the_last`).

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

from tests.sgl_jax_rollout.engine.overlap_worker import CASES, MAX_TOKENS, PROMPTS, workload

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
ALIASED = 64  # bytes: the alignment at which the CPU client takes a host buffer zero-copy


def _aligned_like(buffer: np.ndarray) -> np.ndarray:
    raw = np.zeros(buffer.nbytes + ALIASED, np.uint8)
    start = -raw.ctypes.data % ALIASED
    aligned = raw[start : start + buffer.nbytes].view(buffer.dtype)
    aligned[:] = buffer
    return aligned


@pytest.fixture
def aligned_cache_loc(rollout):
    pool = rollout.engine.model_runner.req_to_token_pool
    kept = pool.cache_loc_host_buf
    pool.cache_loc_host_buf = _aligned_like(kept)
    assert pool.cache_loc_host_buf.ctypes.data % ALIASED == 0
    yield
    pool.cache_loc_host_buf = kept


def test_overlap_on_and_off_give_the_same_completions(rollout, tiny_dir, aligned_cache_loc):
    mine = workload(rollout)
    assert mine["overlap"] is True
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = [sys.executable, "-m", "tests.sgl_jax_rollout.engine.overlap_worker", str(tiny_dir)]
    done = subprocess.run(
        [*args, "off"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    theirs = json.loads(lines[-1][len("RESULT ") :])
    assert theirs["overlap"] is False
    early = {name for name in CASES if min(map(len, mine[name]["tokens"])) < MAX_TOKENS}
    for name in CASES:
        assert mine[name]["tokens"] == theirs[name]["tokens"], name
        tolerance = 5e-6 if name in early else 0.0
        for field in ("logprobs", "entropy"):
            for a, b in zip(mine[name][field], theirs[name][field], strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=tolerance, err_msg=name)
    assert min(len(t) for t in mine["min_new_tokens"]["tokens"]) >= 12
    # Some requests finished (EOS) while others went on (the overlapped finished-request step),
    # and some cases ran every request to the end (the same batches: bitwise equal).
    assert early and early != set(CASES)


def test_the_forward_thread_never_waits_for_a_steps_outputs(rollout, monkeypatch):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    seen = []
    collect = patches.sampler_hooks._collect

    def spy(hooks, scheduler, batch, out):
        per_row = (out.rollout_logprobs, out.rollout_entropy)
        seen.append((all(isinstance(x, jax.Array) for x in per_row), out.next_token_logprobs))
        collect(hooks, scheduler, batch, out)

    monkeypatch.setattr(patches.sampler_hooks, "_collect", spy)
    config = RolloutConfig(max_tokens_to_generate=8, seed=1, return_logprobs=True)
    out = rollout.generate(PROMPTS, config, temperature=1.0, ignore_eos=True)
    assert len(seen) >= 8  # a prefill and the decode steps
    assert all(on_device and upstreams is None for on_device, upstreams in seen), seen
    # and the values the collector gathered from the padded rows are every request's own
    for tokens, logprobs, entropy in zip(out.tokens, out.logprobs, out.entropy, strict=True):
        assert len(tokens) == len(logprobs) == len(entropy) == 8
        assert np.all(np.asarray(logprobs) < 0) and np.all(np.asarray(entropy) > 0)


def test_a_call_whose_requests_end_by_length_runs_no_step_after_their_last(rollout):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    scheduler = rollout.engine._hooks.scheduler
    assert scheduler.enable_overlap
    config = RolloutConfig(max_tokens_to_generate=8, seed=2, return_logprobs=True)
    before = scheduler.forward_ct
    out = rollout.generate(PROMPTS, config, temperature=1.0, ignore_eos=True)
    # one prefill, then seven decode steps; upstream's overlap ran an eighth whose tokens it
    # dropped, because it builds step t + 1 before it has processed step t's
    assert scheduler.forward_ct - before == 8
    assert [len(t) for t in out.tokens] == [8] * len(PROMPTS)
