"""The rollout benchmark's table: columns, host times and ratios from measured pieces (no
engine: the measurements are given)."""

from __future__ import annotations

import pytest

from sgl_jax_rollout_apps.bench.rollout_bench import _columns


def test_columns_put_every_backend_beside_ours_and_divide_by_the_right_one():
    rates = {
        "w": {
            "ours_full": 90.0,
            "ours_plain": 100.0,
            "ours_no_overlap": 100.0,
            "sgl_jax_stock": 120.0,
            "sgl_jax_stock_no_overlap": 110.0,
            "tunix_sglang_jax": 80.0,
            "vanilla": 1000.0,
        }
    }
    ours_host = {"host_ms_per_decode_step": 2.0, "sampler_ms_per_step": 1.0}
    host = {
        "w": {
            "ours_no_overlap": ours_host,
            "sgl_jax_stock_no_overlap": {"host_ms_per_decode_step": 1.5},
        }
    }
    table = _columns(rates, host)
    assert table["tokens_per_s"]["w"] == {**rates["w"], "ours_overlap": 90.0}
    assert table["host_time"]["w"] == {
        "ours": ours_host,
        "sgl_jax_stock": {"host_ms_per_decode_step": 1.5},
    }
    assert table["host_ms_per_decode_step"]["w"] == {"ours": 2.0, "sgl_jax_stock": 1.5}
    ratios = table["ratios"]["w"]
    assert ratios["full_vs_plain"] == pytest.approx(0.9)
    assert ratios["full_vs_sgl_jax_stock"] == pytest.approx(0.75)
    assert ratios["full_vs_tunix_sglang_jax"] == pytest.approx(1.125)
    assert ratios["full_vs_vanilla"] == pytest.approx(0.09)
    assert ratios["overlap_vs_no_overlap"] == pytest.approx(0.9)
    assert "full_vs_sgl_jax_stock_no_overlap" not in ratios
    assert "full_vs_overlap" not in ratios and "full_vs_no_overlap" not in ratios


def test_columns_not_measured_are_absent_and_their_host_time_empty():
    table = _columns({"w": {"ours_full": 90.0, "sgl_jax_stock": 100.0}}, {})
    assert table["tokens_per_s"]["w"] == {
        "ours_full": 90.0,
        "ours_overlap": 90.0,
        "sgl_jax_stock": 100.0,
    }
    assert table["host_ms_per_decode_step"]["w"] == {"ours": None, "sgl_jax_stock": None}
    assert table["ratios"]["w"] == {"full_vs_sgl_jax_stock": pytest.approx(0.9)}


@pytest.mark.parametrize(
    "argv", [["--starts", "0"], ["--starts", "6"], ["--runs", "7", "--starts", "8"]]
)
def test_engine_starts_outside_one_to_runs_exit_2_naming_the_flag(argv, capsys):
    from sgl_jax_rollout_apps.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["bench", "rollout", *argv])
    assert exited.value.code == 2
    assert "--starts must be in [1, --runs" in capsys.readouterr().err
