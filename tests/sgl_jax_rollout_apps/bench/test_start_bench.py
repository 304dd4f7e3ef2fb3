"""`bench start`'s arithmetic and verdict. The engine starts are replaced by canned figures (a
test double: this is about the bench's own code; the cache's behaviour on real starts is
tests/sgl_jax_rollout/utils/test_compilation_cache.py)."""

from __future__ import annotations

import pytest

from sgl_jax_rollout_apps.bench import start_bench


def _canned(monkeypatch, warm_s: float, warm_compiled: int = 0):
    calls = []

    def start(model, cache):
        calls.append(cache)
        if cache is None:
            return {"start_s": 30.0, "programs": 40, "compiled": 40, "read": 0}
        if calls.count(cache) == 1:  # the first start on this cache directory: cold
            return {"start_s": 33.0, "programs": 40, "compiled": 40, "read": 0}
        return {"start_s": warm_s, "programs": 40, "compiled": warm_compiled, "read": 40}

    monkeypatch.setattr(start_bench, "_start", start)
    return calls


def test_warm_starts_are_timed_against_cold_and_uncached_ones(monkeypatch):
    calls = _canned(monkeypatch, warm_s=6.0)
    result = start_bench.run(model_dir="/model", runs=2)
    assert result["median_start_s"] == {"cold": 33.0, "warm": 6.0, "no_cache": 30.0}
    assert result["warm_over_no_cache"] == pytest.approx(0.2)
    assert result["warm_over_cold"] == pytest.approx(6.0 / 33.0)
    assert result["ok"]
    # each turn: a fresh directory started twice (cold, then warm), then no cache
    assert calls[0] == calls[1] and calls[2] is None and calls[3] != calls[0]


@pytest.mark.parametrize(("warm_s", "compiled"), [(12.0, 0), (6.0, 1)])
def test_a_slow_or_compiling_warm_start_misses_the_target(monkeypatch, warm_s, compiled):
    _canned(monkeypatch, warm_s=warm_s, warm_compiled=compiled)
    assert not start_bench.run(model_dir="/model", runs=1)["ok"]
