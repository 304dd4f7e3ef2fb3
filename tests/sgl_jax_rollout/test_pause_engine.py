"""Generation paused in place on the real engine (`RolloutEngine.pause` / `resume`): the
running requests keep their KV cache and continue to the tokens a run without the pause
samples; nothing steps, spins or swaps weights while paused; an abort ends a paused call;
released memory is not paused.

It runs on the session rollout (tests/conftest.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.sampling.options import SamplingOptions

pytestmark = pytest.mark.engine

TOKENS = 60


def rows_and_specs(engine, seed0: int):
    prompts = [engine.tokenizer.encode(t) for t in ("the quick brown fox", "1 2 3 4 5 6")]
    specs = [RequestSpec(SamplingOptions(seed=seed0 + i, temperature=1.0)) for i in range(2)]
    return prompts, specs


def in_thread(fn):
    """Starts `fn` on a thread; returns (thread, box) where box gets its result or error."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def started(engine) -> None:
    """Returns once the engine holds some decode steps of the running call."""
    deadline = time.monotonic() + 30
    while engine.store_sizes()["records"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.03)


def test_paused_requests_keep_their_kv_and_continue_to_the_same_tokens(rollout):
    engine = rollout.engine
    prompts, specs = rows_and_specs(engine, 700)
    free = engine.generate(prompts, specs, TOKENS, ignore_eos=[True, True])
    steps = []
    forward = engine.model_runner.forward

    def spy(*args, **kwargs):
        steps.append(time.monotonic())
        return forward(*args, **kwargs)

    engine.model_runner.forward = spy
    try:
        call, box = in_thread(lambda: engine.generate(prompts, specs, TOKENS, ignore_eos=[1, 1]))
        started(engine)
        engine.pause()
        paused_at, cpu_at = time.monotonic(), time.process_time()
        assert engine.paused
        later, later_box = in_thread(lambda: engine.generate(prompts[:1], specs[:1], 4))
        time.sleep(0.5)
        # Nothing stepped since pause returned, no core spun, both calls wait.
        assert not [t for t in steps if t > paused_at], "a step ran while paused"
        assert time.process_time() - cpu_at < 0.25, "the paused engine kept a core busy"
        assert call.is_alive() and later.is_alive()
        load = engine.load()
        assert load.running_requests == 2 and load.kv_used_tokens > 0  # kept in place
        assert 0 < len(steps) < TOKENS  # paused part-way
        with pytest.raises(RuntimeError, match="update_weights: generation is paused.*resume"):
            engine.update_weights(engine.engine_state())
        engine.resume()
        call.join(60)
        later.join(60)
    finally:
        del engine.model_runner.forward
    assert not engine.paused and "error" not in box and "error" not in later_box, box
    for got, want in zip(box["result"], free, strict=True):
        assert got.tokens == want.tokens
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-6)
    assert len(later_box["result"][0].tokens) >= 1
    assert engine.store_sizes()["records"] == 0


def test_an_abort_ends_a_paused_call_and_resumes_the_engine(rollout):
    engine = rollout.engine
    prompts, specs = rows_and_specs(engine, 800)
    call, box = in_thread(lambda: engine.generate(prompts, specs, 400, ignore_eos=[1, 1]))
    started(engine)
    engine.pause()
    engine.abort("stop the paused call")
    call.join(60)
    assert not call.is_alive() and not engine.paused
    assert "aborted: stop the paused call" in str(box.get("error")), box
    out = engine.generate(prompts, specs, 3)
    assert all(len(c.tokens) >= 1 for c in out)
    engine.release_memory()  # nothing runs to pause; a call resuming it would wait for it
    try:
        with pytest.raises(RuntimeError, match="pause: the engine's memory is released"):
            engine.pause()
    finally:
        engine.resume_memory()
    assert not engine.paused
