"""Releasing the engine's memory while the trainer runs, and resuming (engine-marked; its own
engine, started before the session rollout's: tests/conftest.py).

Measured on the live device arrays of this process (`engine.memory.live_bytes`; CPU has no
allocator statistics): a release leaves at most 5% of the KV pool (and of the weights, when
they go too); while released, every call that needs the engine raises naming the release;
a resume recompiles nothing, leaves the prefix cache empty and samples what the engine
sampled before (same seeds: same tokens, logprobs within 1e-6); released weights come back
only through `update_params`, and `generate` raises until then; a release waits for a
running call, which completes whole, and calls arriving meanwhile wait for the release (with
`resume_on_use`, the first of them resumes); cycles leak nothing.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = pytest.mark.engine

# Over 64 tokens with their completions: at the TPU presets' page size the prefix cache keeps
# whole pages only (test_page_size_engine.py runs these tests at 64).
PROMPTS = ["the quick brown fox jumps over the lazy dog " * 3, "hello world again " * 6]


@pytest.fixture(scope="module")
def engine_rollout(tiny_dir):
    """A rollout of its own (not named `rollout`: tests/conftest.py runs tests on that
    session fixture after the ones with their own engine)."""
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tests.conftest import small_engine_settings

    rollout = SglangJaxRollout(model_path=tiny_dir, engine_settings=small_engine_settings())
    yield rollout
    rollout.shutdown()


def config(**changes):
    from tests.sgl_jax_rollout.test_rollout import config as rollout_config

    return rollout_config(
        **{"max_tokens_to_generate": 16, "max_prompt_length": 96, "seed": [1, 2], **changes}
    )


def assert_same_samples(a, b) -> None:
    for x, y in zip(a.tokens, b.tokens, strict=True):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)


def cached_tokens(engine_rollout) -> int:
    return int(engine_rollout.engine._scheduler.tree_cache.total_size())


def test_a_release_frees_the_kv_pool_and_a_resume_samples_as_before(engine_rollout):
    from sgl_jax_rollout.engine.memory import live_bytes
    from sgl_jax_rollout.utils.compiles import count_compiles

    before = engine_rollout.generate(PROMPTS, config())
    assert cached_tokens(engine_rollout) > 0
    held = live_bytes()
    freed = engine_rollout.release_memory()
    kv = freed["kv_bytes"]
    assert kv > 0 and freed["weight_bytes"] == 0
    assert live_bytes() <= held - 0.95 * kv
    with pytest.raises(RuntimeError, match="generate: the engine's memory is released"):
        engine_rollout.generate(PROMPTS, config())
    with pytest.raises(RuntimeError, match="score: the engine's memory is released"):
        engine_rollout.get_per_token_logps(
            np.asarray(before.left_padded_prompt_tokens), np.asarray([[5, 6], [7, 8]])
        )
    with pytest.raises(RuntimeError, match="already released"):
        engine_rollout.release_memory()
    engine_rollout.resume_memory()
    assert cached_tokens(engine_rollout) == 0
    assert live_bytes() >= held - 0.05 * kv
    with count_compiles() as compiles:
        after = engine_rollout.generate(PROMPTS, config())
    assert compiles.count == 0
    assert_same_samples(before, after)


def test_released_weights_come_back_through_update_params(engine_rollout, trainer):
    from flax import nnx

    from sgl_jax_rollout.engine.memory import live_bytes

    before = engine_rollout.generate(PROMPTS, config())
    held = live_bytes()
    with engine_rollout.released_memory(weights=True) as freed:
        assert freed["weight_bytes"] > 0
        assert live_bytes() <= held - 0.95 * (freed["kv_bytes"] + freed["weight_bytes"])
        with pytest.raises(RuntimeError, match="call resume_memory\\(\\) first, then update"):
            engine_rollout.update_params(nnx.state(trainer, nnx.Param))
    with pytest.raises(RuntimeError, match="generate: the engine's weights were released"):
        engine_rollout.generate(PROMPTS, config())
    engine_rollout.update_params(nnx.state(trainer, nnx.Param))
    assert_same_samples(before, engine_rollout.generate(PROMPTS, config()))


def test_a_call_that_resumes_released_weights_serves_restore_and_peaks_as_planned(
    engine_rollout, trainer
):
    """`resume_on_use` with the weights released (what the learners ask): a `generate` before
    any `update_params` serves `restore()`'s weights (the same samples as before the release)
    and the policy version stays; without `restore` it raises and keeps the memory released.
    At a resume through `update_params` the weights are mapped before the KV pool comes back:
    the live bytes never pass the steady state by more than (weights - KV pool), the peak
    the memory plan counts (two copies of the weights, or weights and KV pool)."""
    from flax import nnx

    from sgl_jax_rollout.engine import memory

    params = nnx.state(trainer, nnx.Param)
    before = engine_rollout.generate(PROMPTS, config())
    version = engine_rollout.policy_version
    engine_rollout.release_memory(weights=True, resume_on_use=True, restore=lambda: params)
    assert_same_samples(before, engine_rollout.generate(PROMPTS, config()))
    assert not engine_rollout.engine.released and engine_rollout.policy_version == version

    held = memory.live_bytes()
    engine_rollout.release_memory(weights=True, resume_on_use=True)
    with pytest.raises(RuntimeError, match="generate: the engine's weights are released until"):
        engine_rollout.generate(PROMPTS, config())
    assert engine_rollout.engine.released
    freed = engine_rollout.engine._released
    with memory.live_bytes_at_resume(engine_rollout.engine) as peaks:
        engine_rollout.update_params(params)
    assert len(peaks) == 2 and not engine_rollout.engine.released
    assert max(peaks) <= held + max(0, freed.weight_bytes - freed.kv_bytes), (peaks, held)
    assert_same_samples(before, engine_rollout.generate(PROMPTS, config()))


def test_a_release_waits_for_the_running_call_and_calls_arriving_meanwhile_wait_for_it(
    engine_rollout,
):
    import time

    gate = engine_rollout.engine._gate
    expected = engine_rollout.generate(PROMPTS, config())
    results = {}

    def run(name, fn):
        def target():
            try:
                results[name] = fn()
            except Exception as err:  # reported below
                results[name] = err

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    def wait_for(condition):
        deadline = time.monotonic() + 30
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.001)

    long = config(max_tokens_to_generate=120, seed=[3, 4])
    first = run("first", lambda: engine_rollout.generate(PROMPTS, long, ignore_eos=True))
    wait_for(lambda: gate.serving_calls() == 1)  # the call runs in the engine
    releasing = run("freed", lambda: engine_rollout.release_memory(resume_on_use=True))
    wait_for(lambda: gate.waiting() == 1)  # the release waits for it
    later = [run(i, lambda: engine_rollout.generate(PROMPTS, config())) for i in range(3)]
    for thread in [first, releasing, *later]:
        thread.join()
    assert not isinstance(results["first"], Exception), results["first"]
    assert [len(t) for t in results["first"].tokens] == [120, 120]
    assert results["freed"]["kv_bytes"] > 0  # after the running call, before the later ones
    for i in range(3):  # the first of them resumed the KV pool; all sampled as before
        assert not isinstance(results[i], Exception), results[i]
        for x, y in zip(expected.tokens, results[i].tokens, strict=True):
            np.testing.assert_array_equal(x, y)
        # together they ran in a larger batch bucket than alone: float32 rounding differs
        for x, y in zip(expected.logprobs, results[i].logprobs, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)
    assert not engine_rollout.engine.released


def test_cycles_leak_nothing_and_compile_nothing(engine_rollout):
    from sgl_jax_rollout.engine.memory import live_bytes
    from sgl_jax_rollout.utils.compiles import count_compiles

    first = None
    with count_compiles() as compiles:
        for _ in range(5):
            with engine_rollout.released_memory():
                pass
            engine_rollout.generate(PROMPTS, config())
            first = first if first is not None else live_bytes()
    assert compiles.count == 0
    assert live_bytes() == first
