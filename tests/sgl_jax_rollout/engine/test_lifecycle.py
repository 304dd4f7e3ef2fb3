"""Starting and stopping the engine from any state: nothing left behind, never a SIGQUIT.

Engine-marked. Each test starts its own engines (one engine per process), so this file must
run before the session rollout exists, where tests/conftest.py puts every test that does not
use it. Faults are injected into OUR code with `monkeypatch` around the real
engine (no test double of the engine).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ENGINE_THREADS = ("sglang::scheduler", "sglang-jax::detokenizer", "sgl-jax-rollout")
UPSTREAM_TARGETS = ("watchdog_thread", "run_loop_forever", "forward_thread_func")  # overlap


def config(**changes):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    base = dict(max_tokens_to_generate=8, max_prompt_length=16, temperature=0.0)
    return RolloutConfig(**{**base, **changes})


@pytest.fixture
def handlers():
    """Records SIGQUITs during the test; yields the handlers the process had."""
    from sgl_jax_rollout.engine import patches

    if patches.current() is not None:
        pytest.skip("another engine is still running in this process")
    received = []
    previous = signal.signal(signal.SIGQUIT, lambda *_: received.append(1))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGQUIT, signal.SIGCHLD)}
    yield before
    signal.signal(signal.SIGQUIT, previous)
    assert not received, "the process received SIGQUIT"


def leftovers(handlers) -> list[str]:
    """What an engine left behind: threads, the process's engine slot, signal handlers."""
    from sgl_jax_rollout.engine import patches

    deadline = time.monotonic() + 10  # daemon threads may need a moment after shutdown
    while True:
        found = [
            t.name
            for t in threading.enumerate()
            if t.name.startswith(ENGINE_THREADS)
            or t.name.endswith(tuple(f"({target})" for target in UPSTREAM_TARGETS))
        ]
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if patches.current() is not None:
        found.append("an active engine")
    found += [
        f"signal {sig} handler changed"
        for sig, handler in handlers.items()
        if signal.getsignal(sig) is not handler
    ]
    return found


def start(tiny_dir, **kwargs):
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tests.conftest import small_engine_settings

    return SglangJaxRollout(model_path=tiny_dir, engine_settings=small_engine_settings(), **kwargs)


def test_a_start_failing_inside_the_scheduler_leaves_nothing(tiny_dir, handlers, monkeypatch):
    from sgl_jax_rollout.engine.sampler_module import RolloutSampler

    def broken(self, *args, **kwargs):
        raise ValueError("injected start fault")

    monkeypatch.setattr(RolloutSampler, "__init__", broken)
    with pytest.raises(RuntimeError, match="failed to start: .*injected start fault"):
        start(tiny_dir)
    assert leftovers(handlers) == []


def test_a_failed_initial_weight_load_shuts_the_engine_down(tiny_dir, handlers):
    import jax.numpy as jnp
    from flax import nnx

    class Unrelated(nnx.Module):
        def __init__(self):
            self.weight = nnx.Param(jnp.zeros((3, 3)))

    with pytest.raises(Exception, match="weight"):
        start(tiny_dir, rollout_actor=Unrelated())
    assert leftovers(handlers) == []


def test_an_uncontainable_fault_stops_the_engine_and_a_new_one_starts(
    tiny_dir, handlers, monkeypatch
):
    from sgl_jax_rollout.engine import patches

    rollout = start(tiny_dir)
    engine = rollout.engine
    assert signal.getsignal(signal.SIGQUIT) is handlers[signal.SIGQUIT]  # upstream's is gone
    assert signal.getsignal(signal.SIGCHLD) is handlers[signal.SIGCHLD]
    expected = rollout.generate(["hello there"], config()).tokens[0].tolist()
    ipc_files = [
        Path(v.removeprefix("ipc://"))
        for v in vars(engine._engine.port_args).values()
        if isinstance(v, str) and v.startswith("ipc://")
    ]
    assert ipc_files and all(p.exists() for p in ipc_files)

    def always(*args):  # fails the step and its neutral re-run: the engine cannot go on
        raise ValueError("injected fatal fault")

    monkeypatch.setattr(patches.sampler_hooks, "build_rows", always)
    with pytest.raises(RuntimeError, match="stopped after a fault.*injected fatal fault"):
        rollout.generate(["hello there"], config())
    assert engine._hooks.released.wait(60), "the engine did not shut itself down"
    with pytest.raises(RuntimeError, match="stopped after a fault.*build a new one"):
        rollout.generate(["hello there"], config())
    monkeypatch.undo()
    assert leftovers(handlers) == []
    assert not any(p.exists() for p in ipc_files)

    again = start(tiny_dir)
    try:
        assert again.generate(["hello there"], config()).tokens[0].tolist() == expected
        errors: list[BaseException] = []

        def long_call():
            try:
                again.generate(
                    ["hello there"] * 2, config(max_tokens_to_generate=400), ignore_eos=True
                )
            except BaseException as err:
                errors.append(err)

        caller = threading.Thread(target=long_call)
        caller.start()
        while again.engine.store_sizes()["records"] == 0 and caller.is_alive():
            time.sleep(0.01)
        time.sleep(0.5)
        stopped = time.perf_counter()
        again.shutdown()  # while the other thread is inside generate
        caller.join(30)
        assert not caller.is_alive() and time.perf_counter() - stopped < 30
        assert len(errors) == 1 and "shut down" in str(errors[0]), errors
    finally:
        again.shutdown()
    assert leftovers(handlers) == []
