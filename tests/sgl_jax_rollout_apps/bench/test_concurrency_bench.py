"""bench concurrency's measurement on the session engine, at one small size: both sides run,
their seeded completions match token for token, and the figures are there. (The targets are
the benchmark's, on its own engine: README, "Concurrent calls".)"""

import pytest

from sgl_jax_rollout_apps.bench.concurrency_bench import TOKENS, measure

pytestmark = pytest.mark.engine


def test_concurrent_calls_match_one_call_and_are_measured(rollout):
    sizes = measure(rollout, sizes=(4,), runs=1)
    four = sizes["4"]
    assert four["same_tokens_as_one_call"]
    assert 1 <= four["most_calls_admitted_at_once"] <= 4
    assert four["one_call_tokens_per_s"] == pytest.approx(4 * TOKENS / four["one_call_s"], 0.01)
    assert four["ratio"] == pytest.approx(four["concurrent_s"] / four["one_call_s"], 0.01)
