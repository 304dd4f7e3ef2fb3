"""Markers (`engine` tests need sgl_jax importable, `tpu` tests need a TPU, `tunix_main` tests
tunix main's GRPO switches; each skips otherwise; `tunix`, set here on every test that touches
tunix, selects what `make test-tunix-main` runs: tests/tunix_phase.py)
and the engine tests' shared fixtures: one tiny model, one trainer model, one rollout for the
whole session, and `small_engine_settings`, where every engine test takes its settings from.
The run keeps compiled programs in JAX's persistent compilation cache and ends with its engine
starts and compiles (`pytest_configure`, `pytest_terminal_summary`).

One engine per process: tests run in engine phases (`engine_phase`), whatever their files'
names: tests that start their own engine (or none) first, then those on the session rollout,
then the test marked `ends_session_engine` (it shuts the session engine down), then those
marked `after_session_engine` (they start their own engine once it is gone).

With `SGL_JAX_ROLLOUT_REQUIRE_ENGINE=1` (CI, `make test REQUIRE_ENGINE=1`) the engine is
required: a missing engine stops the run at collection, and an engine-marked test that skips
for any reason fails (a `tpu`- or `tunix_main`-marked test may still skip)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path

import pytest

REQUIRE_ENGINE_VAR = "SGL_JAX_ROLLOUT_REQUIRE_ENGINE"


def _engine_required() -> bool:
    return os.environ.get(REQUIRE_ENGINE_VAR) == "1"


def _has_tpu() -> bool:
    import jax

    try:
        return bool(jax.devices("tpu"))
    except RuntimeError:
        return False


def _is_tunix_main() -> bool:
    import dataclasses

    from sgl_jax_rollout.tunix_compat import GRPOConfig

    return "use_rollout_logps" in {f.name for f in dataclasses.fields(GRPOConfig)}


def engine_phase(item) -> int:
    """0: needs no engine or starts its own; 1: uses the session `rollout`; 2: shuts the
    session engine down; 3: starts its own engine after that."""
    if item.get_closest_marker("after_session_engine") is not None:
        return 3
    if item.get_closest_marker("ends_session_engine") is not None:
        return 2
    return 1 if "rollout" in getattr(item, "fixturenames", ()) else 0


# The run's own helpers; absent where this file is copied into a throw-away suite (pytester).
OWN_SUITE = (Path(__file__).parent / "run_stats.py").is_file()


def pytest_configure(config):
    """The run's compilation cache and its counts of engine starts and compiles.

    JAX's persistent compilation cache under the run's cache folder (`.pytest_cache/`, or
    `SGL_JAX_ROLLOUT_COMPILATION_CACHE_DIR` where set; set empty, no cache): a fresh clone
    starts cold, and every engine or trainer that compiles a program an earlier one compiled
    (in this process, a test's subprocess or a later run) reads it instead. The counts of the
    test's subprocesses come back through a file (`run_stats`)."""
    if not OWN_SUITE:
        return
    import tempfile

    from sgl_jax_rollout.utils.compilation_cache import CACHE_DIR_VAR, enable_compilation_cache
    from tests import run_stats

    cache = os.environ.get(CACHE_DIR_VAR)
    if cache is None:
        cache = os.environ[CACHE_DIR_VAR] = str(config.rootpath / ".pytest_cache" / "xla-cache")
    if cache:
        directory = enable_compilation_cache(cache)
        # JAX's own variables: every JAX process a test starts (workers, scripts, the CLI)
        # uses the same folder, caching every program as the engine does.
        os.environ.update(
            JAX_COMPILATION_CACHE_DIR=str(directory),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
        )
    handle, stats = tempfile.mkstemp(prefix="run-stats-", suffix=".jsonl")
    os.close(handle)
    os.environ[run_stats.STATS_FILE_VAR] = stats
    run_stats.listen()


def pytest_runtest_setup(item):
    if OWN_SUITE:
        from tests import run_stats

        run_stats.listen()


def pytest_runtest_logreport(report):
    if OWN_SUITE:
        from tests import run_stats

        run_stats.record_test(report)


def pytest_terminal_summary(terminalreporter):
    if not OWN_SUITE:
        return
    from sgl_jax_rollout.utils.compilation_cache import CACHE_DIR_VAR
    from tests import run_stats

    path = Path(os.environ[run_stats.STATS_FILE_VAR])
    children = run_stats.subprocess_totals(path)
    path.unlink(missing_ok=True)
    total = run_stats.RunStats(processes=0)
    total.add(run_stats.own())
    total.add(children)
    terminalreporter.section("engine starts and compiles")
    for line in total.lines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(
        f"of which in test subprocesses: {children.engine_starts} engine starts, "
        f"{children.compiles} XLA programs ({children.cache_misses} compiled)"
    )
    terminalreporter.write_line(f"compilation cache: {os.environ[CACHE_DIR_VAR] or 'off'}")


# "reversed" (`.ci/run`'s tunix-main run, beside `make test`): the session engine's tests first
# (engine phases 1-3), then the rest, each part's test modules in reverse order, and each
# parametrized test's cases in reverse too. The two runs then hold a session engine at
# different times (memory), and each reads the programs the other compiled first instead of
# compiling them at the same time: the two reached the families' cases in the same minute and
# ran them side by side, case for case, each compiling every replica's engine.
ORDER_VAR = "SGL_JAX_ROLLOUT_TEST_ORDER"


def pytest_collection_modifyitems(config, items):
    order = os.environ.get(ORDER_VAR, "")
    if order not in ("", "reversed"):
        raise pytest.UsageError(f"{ORDER_VAR} must be 'reversed' or unset, got {order!r}")
    first = {}  # each module's and each test function's place in the collection
    place = {}
    for index, item in enumerate(items):
        first.setdefault(item.path, index)
        first.setdefault((item.path, getattr(item, "originalname", item.name)), index)
        place[item.nodeid] = index
    if order == "reversed":
        items.sort(
            key=lambda it: (
                *(engine_phase(it) == 0, engine_phase(it), -first[it.path]),
                *(first[it.path, getattr(it, "originalname", it.name)], -place[it.nodeid]),
            )
        )
    else:
        items.sort(key=engine_phase)  # stable: collection order within a phase
    no_engine = importlib.util.find_spec("sgl_jax") is None
    if no_engine and _engine_required():
        raise pytest.UsageError(
            f"{REQUIRE_ENGINE_VAR}=1 but sgl_jax is not importable: install the engine "
            "(make engine WHEELHOUSE=DIR) or unset the variable"
        )
    for item in items:
        if OWN_SUITE and _touches_tunix(item):
            item.add_marker(pytest.mark.tunix)
        # Markers, not keywords: keywords also hold directory names (tests/.../engine/).
        if no_engine and item.get_closest_marker("engine") is not None:
            item.add_marker(pytest.mark.skip(reason="sgl_jax is not installed"))
        if item.get_closest_marker("tpu") is not None and not _has_tpu():
            item.add_marker(pytest.mark.skip(reason="no TPU present"))
        if item.get_closest_marker("tunix_main") is not None and not _is_tunix_main():
            item.add_marker(pytest.mark.skip(reason="needs tunix main (make test-tunix-main)"))


def _touches_tunix(item) -> bool:
    from tests.tunix_phase import TRAINER_FIXTURES, touches_tunix

    return touches_tunix(item.path) or bool(
        TRAINER_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Where the engine is required, an engine test that skips has not passed: fail it."""
    report = (yield).get_result()
    if (
        report.skipped
        and _engine_required()
        and item.get_closest_marker("engine") is not None
        and item.get_closest_marker("tpu") is None
        and item.get_closest_marker("tunix_main") is None
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"engine test skipped while {REQUIRE_ENGINE_VAR}=1: {reason}"


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Between test modules (after their fixtures, engines included, are torn down), outside
    the session engine's lifetime (it starts with the first phase-1 test and ends in phase
    2), drop every compiled program. XLA's CPU backend maps each executable's code into
    memory, and an engine's programs stay mapped after its shutdown (about 3,500 mappings
    each, held by jax's caches): a whole run starts a score of engines in one process and
    reached the kernel's 65,530 mappings (`vm.max_map_count`), where LLVM fails to allocate
    and the process segfaults."""
    if nextitem is None or nextitem.module is item.module or engine_phase(item) == 1:
        return
    import ctypes
    import gc

    import jax

    jax.clear_caches()
    # What the module's engines and trainers freed goes back to the system: glibc keeps freed
    # heap in its arenas, and two runs side by side (.ci/run) each grew to 10 GB without this.
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def perturbed(state, scale: float = 0.5, seed: int = 0):
    """`state` with seeded normal noise of std `scale` added to every leaf."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(state)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    noisy = [
        x + scale * jax.random.normal(k, x.shape, x.dtype)
        for x, k in zip(leaves, keys, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, noisy)


def after_asyncio_run(fn):
    """`fn()`'s result, called on a new thread once `asyncio.run` has ended there: a caller
    whose thread has no event loop left, as the main thread of a program that drove a tunix
    worker with `asyncio.run`."""
    import asyncio
    import concurrent.futures

    def call():
        asyncio.run(asyncio.sleep(0))
        return fn()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


TEST_SETTINGS = dict(
    max_running_requests=16,
    precompile_bs_paddings=(1, 4, 16),
    precompile_token_paddings=(256, 1024),
    max_prefill_tokens=1024,
    context_length=512,
    max_total_tokens=16384,
)


def small_engine_settings(**changes):
    """The suite's engine settings (`TEST_SETTINGS`) with `changes`: every engine test takes
    its settings from here. Engines whose settings (and model) are equal run the same programs,
    which the run's compilation cache then compiles once; each change of a size or a bucket
    compiles its own, so change only what the test is about."""
    return dict(TEST_SETTINGS, **changes)


def one_bucket_settings(rows: int, tokens: int, context_length: int, total: int, **changes):
    """`small_engine_settings` for a test whose calls all fit one batch bucket of `rows` and
    one prefill bucket of `tokens`: all the engine compiles then. `total`: the KV pool's
    tokens."""
    return small_engine_settings(
        max_running_requests=rows,
        precompile_bs_paddings=(rows,),
        precompile_token_paddings=(tokens,),
        max_prefill_tokens=tokens,
        context_length=context_length,
        max_total_tokens=total,
        **changes,
    )


# The session engine also compiles this mode at start (test_rollout.py checks it).
LISTED_SAMPLER_MODE = {"entropy_source": "processed", "entropy_top_k": 24}


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen3")


@pytest.fixture(scope="session")
def trainer(tiny_dir):
    from tunix_adapter.models import load_tunix_model

    return load_tunix_model(tiny_dir)


@pytest.fixture(scope="session")
def rollout(tiny_dir):
    if importlib.util.find_spec("sgl_jax") is None:
        pytest.skip("sgl_jax is not installed")
    from sgl_jax_rollout.rollout import SglangJaxRollout

    worker = SglangJaxRollout(
        model_path=tiny_dir,
        engine_settings=dict(TEST_SETTINGS, sampler_modes=(LISTED_SAMPLER_MODE,)),
    )
    yield worker
    worker.shutdown()


@pytest.fixture(autouse=True)
def stores_empty_after(request):
    """Every engine test ends with no per-request state left in the engine."""
    yield
    if "rollout" in request.fixturenames:
        worker = request.getfixturevalue("rollout")
        if worker.engine._engine is not None:
            assert worker.engine.store_sizes() == {
                "specs": 0,
                "records": 0,
                "completions": 0,
                "watches": 0,
                "detokenizer_states": 0,
            }
