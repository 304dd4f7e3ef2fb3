"""The soak of `sgl_jax_rollout_apps.bench.soak`, trimmed to 60 requests and 3 cycles
(engine-marked).

It runs on the session rollout of tests/conftest.py (one engine per process), which orders it
after the tests that start their own engines and before the test that shuts the session
engine down. `pytest --collect-only -q` shows the order.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


def test_trimmed_soak_has_no_bad_completion_and_runs_every_check(rollout):
    from sgl_jax_rollout_apps.bench import soak

    result = soak.run_on(rollout, requests=60, cycles=3, seed=0)

    assert result["bad"] == 0, result["failures"]
    assert result["completions"] > result["requests"]  # calls with n = 2 and 4 ran
    # Re-scoring compared at least a third of the completions, every one within tolerance.
    assert 3 * result["checked_rescored"] >= result["completions"]
    assert result["max_abs_logprob_diff"] <= soak.RESCORE_ATOL
    # Stop ids, stop strings and the length limit each ended some completions.
    assert all(
        result["ended_by"].get(end, 0) > 0 for end in ("stop_token", "stop_string", "length")
    )
    assert result["prompt_tokens"][0] == 1 and result["prompt_tokens"][1] >= 240
    assert not any(result["stores"].values()), result["stores"]
    assert result["rss_start_mb"] > 0
    assert result["rss_growth_outside_compiles_pct"] <= soak.MAX_RSS_GROWTH_PCT
    assert result["ok"]
