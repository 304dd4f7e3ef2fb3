"""Faults inside the engine fail exactly the requests of their step; the engine goes on.
Bad inputs raise before the engine is touched; other default PRNG implementations sample.

Each test injects a fault into OUR code on the scheduler thread (row building, the collector,
the sampler's trace) with `monkeypatch`, on the real shared engine: these are fault
injections around a real engine, not test doubles of it. After every fault the call raises a
RuntimeError naming it, the per-request stores are empty (`stores_empty_after` in
conftest.py), and the next call returns what it returned before the fault.

It runs on the session rollout, before the test that shuts it down (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import numpy as np
import pytest

from sgl_jax_rollout.engine import patches, sampler_module
from sgl_jax_rollout.engine.collector import Collector
from sgl_jax_rollout.engine.patches import sampler_hooks
from sgl_jax_rollout.tunix_compat import RolloutConfig
from tests.conftest import after_asyncio_run

pytestmark = pytest.mark.engine

PROMPTS = ["the quick brown fox", "1 2 3 4 5 6 7 8"]
MARK_T = 0.625  # a temperature no other test uses: marks the requests a fault targets


def config(**changes) -> RolloutConfig:
    base = dict(
        max_tokens_to_generate=12,
        max_prompt_length=32,
        temperature=1.0,
        seed=5,
        return_logprobs=True,
    )
    return RolloutConfig(**{**base, **changes})


@pytest.fixture(autouse=True)
def no_sigquit():
    """Fails a test during which anything sends this process SIGQUIT."""
    received = []
    previous = signal.signal(signal.SIGQUIT, lambda *_: received.append(1))
    yield
    signal.signal(signal.SIGQUIT, previous)
    assert not received, "the process received SIGQUIT"


@pytest.fixture
def reference(rollout):
    out = rollout.generate(PROMPTS, config())
    return [t.tolist() for t in out.tokens], out.logprobs


def still_serving(rollout, reference):
    out = rollout.generate(PROMPTS, config())
    assert [t.tolist() for t in out.tokens] == reference[0]
    for got, want in zip(out.logprobs, reference[1], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_raising_row_builder_fails_its_requests_only(rollout, reference, monkeypatch):
    original = sampler_hooks.build_rows

    def build_rows(specs, *args):
        if any(s is not None and s.options.temperature == MARK_T for s in specs):
            raise ValueError("injected row fault")
        return original(specs, *args)

    monkeypatch.setattr(sampler_hooks, "build_rows", build_rows)
    with pytest.raises(
        RuntimeError,
        match=r"2 of 2 requests failed: an engine step failed: "
        r"ValueError: injected row fault",
    ):
        rollout.generate(PROMPTS, config(temperature=MARK_T))
    still_serving(rollout, reference)


@pytest.mark.parametrize("hook", ["record", "stash_step"])
def test_a_raising_collector_fails_its_requests_only(rollout, reference, monkeypatch, hook):
    original = getattr(Collector, hook)
    calls = []

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 3:  # mid-generation: some tokens were recorded already
            raise KeyError("injected collector fault")
        return original(self, *args)

    monkeypatch.setattr(Collector, hook, failing)
    with pytest.raises(RuntimeError, match="injected collector fault"):
        rollout.generate(PROMPTS, config())
    monkeypatch.setattr(Collector, hook, original)
    still_serving(rollout, reference)


def test_a_sampler_that_fails_to_compile_fails_its_requests_only(rollout, reference, monkeypatch):
    original = sampler_module.sample

    def sample(logits, batch, config):
        if config.top_logprobs == 5:  # raised while tracing: no program for this config
            raise TypeError("injected compile fault")
        return original(logits, batch, config=config)

    monkeypatch.setattr(sampler_module, "sample", sample)
    with pytest.raises(RuntimeError, match="injected compile fault"):
        rollout.generate(PROMPTS, config(), top_logprobs=5)
    still_serving(rollout, reference)
    monkeypatch.setattr(sampler_module, "sample", original)
    rollout.generate(PROMPTS, config(), top_logprobs=5)  # no failure was cached


def test_with_overlap_a_sampler_failure_fails_the_requests_of_its_step(
    rollout, reference, monkeypatch
):
    """With overlap the sampler of step t runs on the forward thread while the scheduler
    processes step t - 1 (upstream sets `launch_done` after the forward, before sampling). A
    call whose prompts exceed one prefill step (`max_prefill_tokens`) is prefilled in two
    steps; a one-off failure in the second (the request it prefills, C) must fail C, whose
    step it was, and none of the others. Charged to the first step, C would go on from a
    neutral greedy token and the call return as if C had been sampled. The test holds the
    processing of step t - 1 until step t's sampler has failed, the order the race takes when
    the scheduler thread is the slower."""
    assert rollout.engine._hooks.scheduler.enable_overlap
    sample_step, collect = sampler_hooks._sample_step, sampler_hooks._collect
    first: set = set()
    injected, held = [], []

    def failing_sample_step(sample, runner, hooks, logits_output, metadata):
        rids = set(getattr(metadata, "rollout_rids", []))
        if not first:
            first.update(rids)  # the first prefill step's requests
        elif rids - first and not injected:  # the step prefilling the rest
            injected.append(rids - first)
            raise ValueError("injected sampler fault")
        return sample_step(sample, runner, hooks, logits_output, metadata)

    def collect_after_the_failure(hooks, scheduler, batch, out):
        launched = {r.rid for r in patches.hooks.batch_requests(scheduler.cur_batch or batch)}
        processed = {r.rid for r in patches.hooks.batch_requests(batch)}
        if first and launched - first and processed <= first and not held:
            deadline = time.perf_counter() + 60
            while not hooks.failed_samples and time.perf_counter() < deadline:
                time.sleep(0.001)
            held.append(bool(hooks.failed_samples))
        return collect(hooks, scheduler, batch, out)

    monkeypatch.setattr(sampler_hooks, "_sample_step", failing_sample_step)
    monkeypatch.setattr(sampler_hooks, "_collect", collect_after_the_failure)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "green", "seven"]
    rng = np.random.default_rng(7)
    # three prompts of about 400 tokens each, distinct (no shared prefix in the radix cache):
    # more than one prefill step's 1024 tokens (tests/conftest.py TEST_SETTINGS)
    prompts = [f"{i} " + " ".join(rng.choice(words, 125)) for i in range(3)]
    with pytest.raises(
        RuntimeError,
        match=r"1 of 3 requests failed: an engine step failed: ValueError: injected sampler fault",
    ):
        rollout.generate(prompts, config(max_prompt_length=480, max_tokens_to_generate=8))
    assert len(injected) == 1 and len(injected[0]) == 1 and held == [True], (injected, held)
    monkeypatch.undo()
    still_serving(rollout, reference)


def test_a_fault_while_scoring_fails_the_scoring_call_only(rollout, reference, monkeypatch):
    out = rollout.generate(PROMPTS, config())
    width = max(len(t) for t in out.tokens)
    completions = np.full((len(PROMPTS), width), rollout.pad_id(), np.int32)
    for i, t in enumerate(out.tokens):
        completions[i, : len(t)] = t
    before = np.asarray(rollout.get_per_token_logps(out.left_padded_prompt_tokens, completions))

    def fallback_spec(req):
        raise ValueError("injected scoring fault")

    monkeypatch.setattr(sampler_hooks, "_fallback_spec", fallback_spec)
    with pytest.raises(RuntimeError, match="2 of 2 scoring failed: .*injected scoring fault"):
        rollout.get_per_token_logps(out.left_padded_prompt_tokens, completions)
    monkeypatch.undo()
    after = np.asarray(rollout.get_per_token_logps(out.left_padded_prompt_tokens, completions))
    np.testing.assert_array_equal(after, before)
    still_serving(rollout, reference)


@pytest.mark.parametrize("aborter", ["main thread", "thread after asyncio.run"])
def test_an_abort_in_the_middle_of_a_batch_ends_the_call_and_the_engine_goes_on(
    rollout, reference, aborter
):
    errors: list[BaseException] = []
    started = time.perf_counter()

    def long_call():
        try:
            rollout.generate(
                PROMPTS * 2,
                config(max_tokens_to_generate=400, max_prompt_length=64),
                ignore_eos=True,
            )
        except BaseException as err:
            errors.append(err)

    caller = threading.Thread(target=long_call)
    caller.start()
    engine = rollout.engine
    while engine.store_sizes()["records"] == 0 and caller.is_alive():
        time.sleep(0.01)
    # some steps ran: the requests are in the running batch (a 400-token call takes about a
    # second on a 2-core CPU, so the abort comes well before its end)
    time.sleep(0.05)
    if aborter == "main thread":
        engine.abort("test abort")
    else:  # a thread with no event loop left (upstream's abort once raised there)
        after_asyncio_run(lambda: engine.abort("test abort"))
    caller.join(60)
    assert not caller.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "4 of 4 requests failed: aborted: test abort" in str(errors[0])
    assert time.perf_counter() - started < 30  # 400 tokens each would take far longer
    still_serving(rollout, reference)


def test_a_cancelled_scope_ends_its_own_call_and_the_others_go_on(rollout, reference):
    """`cancel_scope`: the scope's call ends, aborted, naming the reason; a call of another
    thread running beside it in the same batch completes whole; a later call in the cancelled
    scope raises before the engine is touched."""
    from sgl_jax_rollout.engine.cancel_scope import cancel_scope

    results: dict[str, object] = {}
    opened = threading.Event()
    scopes = []

    def call(name, tokens, scoped):
        try:
            with cancel_scope() if scoped else contextlib.nullcontext() as scope:
                scopes.append(scope)
                opened.set()
                results[name] = rollout.generate(
                    PROMPTS,
                    config(max_tokens_to_generate=tokens, max_prompt_length=64),
                    ignore_eos=True,
                )
        except BaseException as err:
            results[name] = err

    mine = threading.Thread(target=call, args=("scoped", 400, True))
    other = threading.Thread(target=call, args=("other", 40, False))
    mine.start()
    opened.wait(10)
    other.start()
    engine = rollout.engine
    while engine.store_sizes()["records"] == 0 and mine.is_alive():
        time.sleep(0.01)
    time.sleep(0.05)
    scopes[0].cancel("the trajectory was cancelled")
    mine.join(60)
    other.join(60)
    error = results["scoped"]
    assert isinstance(error, RuntimeError), error
    assert "2 of 2 requests failed: aborted: the trajectory was cancelled" in str(error)
    assert [len(t) for t in results["other"].tokens] == [40, 40]
    with cancel_scope() as scope:
        scope.cancel("gone")
        sent = engine.prefill_counts.sent
        with pytest.raises(RuntimeError, match=r"aborted: gone \(before the call started\)"):
            rollout.generate(PROMPTS, config())
        assert engine.prefill_counts.sent == sent
    still_serving(rollout, reference)


@pytest.fixture
def engine_untouched(rollout, monkeypatch):
    """Fails the test if a request reaches the engine."""

    def submit(**fields):
        raise AssertionError("the engine was touched")

    monkeypatch.setattr(rollout.engine._requests, "_submit", submit)


def test_bad_token_ids_raise_naming_them_before_the_engine(rollout, engine_untouched):
    vocab = rollout.engine.vocab_size
    prompts = np.asarray([[0, 5, 6]], np.int32)
    with pytest.raises(
        ValueError, match=rf"completion 0: token 1 is {vocab}, outside .*\[0, {vocab}\)"
    ):
        rollout.get_per_token_logps(prompts, np.asarray([[7, vocab, 8]], np.int32))
    with pytest.raises(ValueError, match=r"prompt 0: token 0 is -3"):
        rollout.engine.score([[-3, 4]], [[5]])
    with pytest.raises(ValueError, match=r"eos_tokens\[0\]"):
        rollout.generate(PROMPTS, config(eos_tokens=[vocab + 5]))
    with rollout.session() as s, pytest.raises(ValueError, match=rf"prompt\[2\] = {vocab}"):
        s.complete([1, 2, vocab])


@pytest.mark.parametrize(("impl", "top_logprobs"), [("rbg", 4), ("unsafe_rbg", 6)])
def test_other_default_prng_impls_sample_the_same_tokens(rollout, impl, top_logprobs):
    """The sampler's keys are threefry whatever the default: a sampler config first traced
    while `jax_default_prng_impl` is rbg / unsafe_rbg (a `top_logprobs` no other test uses,
    which changes no token) draws what the threefry default drew."""
    import jax

    key = jax.random.PRNGKey(11)  # made under the threefry default: the same seed throughout

    def draw(**overrides):
        out = rollout.generate(PROMPTS, config(seed=key), **overrides)
        return [t.tolist() for t in out.tokens]

    before = jax.config.jax_default_prng_impl
    expected = draw()
    jax.config.update("jax_default_prng_impl", impl)
    try:
        assert draw(top_logprobs=top_logprobs) == expected
        assert draw(top_logprobs=top_logprobs) == expected
    finally:
        jax.config.update("jax_default_prng_impl", before)
