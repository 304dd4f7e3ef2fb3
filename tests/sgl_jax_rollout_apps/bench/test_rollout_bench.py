"""The rollout benchmark's table: columns, host times and ratios from measured pieces (no
engine: the measurements are given)."""

from __future__ import annotations

import pytest

from sgl_jax_rollout_apps.bench.rollout_bench import _columns


def test_columns_put_every_backend_beside_ours_and_divide_by_the_right_one():
    host = {"host_ms_per_decode_step": 2.0, "sampler_ms_per_step": 1.0}
    ours = {
        "w": {
            **{"ours_full": 90.0, "ours_plain": 100.0, "ours_overlap": 90.0},
            **{"ours_no_overlap": 100.0, "host": host},
        }
    }
    stock = {"w": {"tokens_per_s": 120.0}}
    stock_no_overlap = {"w": {"tokens_per_s": 110.0, "host_ms_per_decode_step": 1.5}}
    table = _columns(ours, stock, stock_no_overlap, tunix_sglang_jax={"w": 80.0}, vanilla={})
    assert table["tokens_per_s"]["w"] == {
        "ours_full": 90.0,
        "ours_plain": 100.0,
        "ours_overlap": 90.0,
        "ours_no_overlap": 100.0,
        "sgl_jax_stock": 120.0,
        "sgl_jax_stock_no_overlap": 110.0,
        "tunix_sglang_jax": 80.0,
        "vanilla": None,
    }
    assert table["host_time"]["w"] == {
        "ours": host,
        "sgl_jax_stock": {"host_ms_per_decode_step": 1.5},
    }
    assert table["host_ms_per_decode_step"]["w"] == {"ours": 2.0, "sgl_jax_stock": 1.5}
    ratios = table["ratios"]["w"]
    assert ratios["full_vs_plain"] == pytest.approx(0.9)
    assert ratios["full_vs_sgl_jax_stock"] == pytest.approx(0.75)
    assert ratios["full_vs_tunix_sglang_jax"] == pytest.approx(1.125)
    assert ratios["full_vs_vanilla"] is None  # not measured: no ratio, never a made-up one
    assert ratios["overlap_vs_no_overlap"] == pytest.approx(0.9)
    assert "full_vs_sgl_jax_stock_no_overlap" not in ratios
    assert "full_vs_overlap" not in ratios and "full_vs_no_overlap" not in ratios


def test_columns_without_the_stock_engine_leave_its_figures_empty():
    ours = {"w": {"ours_full": 90.0, "host": {"host_ms_per_decode_step": 2.0}}}
    table = _columns(ours, {}, {})
    assert table["tokens_per_s"]["w"]["sgl_jax_stock"] is None
    assert table["host_ms_per_decode_step"]["w"] == {"ours": 2.0, "sgl_jax_stock": None}
    assert table["ratios"]["w"] == {"full_vs_sgl_jax_stock": None}
