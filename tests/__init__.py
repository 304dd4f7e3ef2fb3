"""The test suite. A test's subprocess that runs a module of this package (`python -m tests....`)
counts its engine starts and compiles for the run's summary (`run_stats`, conftest.py)."""

import os

if os.environ.get("SGL_JAX_ROLLOUT_RUN_STATS"):
    from tests import run_stats

    run_stats.record_subprocess()
