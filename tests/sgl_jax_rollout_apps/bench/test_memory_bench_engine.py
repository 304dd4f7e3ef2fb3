"""`bench memory` on the built-in model, one run and two cycles (engine-marked; its own
engine, before the session rollout's): its targets hold and its keys are the documented ones
(docs/benchmarks.md)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


def test_memory_bench_meets_its_targets_on_the_built_in_model(tiny_dir):
    from sgl_jax_rollout_apps.bench import memory_bench

    result = memory_bench.measure(str(tiny_dir), runs=1, cycles=2)
    assert result["ok"], result
    assert result["kv_bytes"] > 0 and result["weight_bytes"] > 0
    assert abs(result["kv_left_frac"]) <= memory_bench.TARGET_LEFT_FRAC
    assert result["kv_same_tokens"] and result["weights_same_tokens"]
    assert result["compiles"] == 0 and result["leak_bytes"] <= 0
    assert set(result["live_bytes"]) == {
        "before",
        "released_kv",
        "resumed",
        "released_kv_and_weights",
    }
