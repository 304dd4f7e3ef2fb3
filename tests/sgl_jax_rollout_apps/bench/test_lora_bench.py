"""bench lora's statistics against a float64 numpy reference written out here, and its CLI
target. (The measurement itself, which needs the engine and 100 optimizer steps, is the
benchmark's: docs/benchmarks.md, "bench lora".)"""

import numpy as np
import pytest

from sgl_jax_rollout_apps.bench.lora_bench import moves
from sgl_jax_rollout_apps.cli import build_parser


def test_moves_are_each_sides_change_from_its_own_base():
    rng = np.random.default_rng(0)
    base = {side: rng.normal(-2.0, 1.0, 50) for side in ("engine", "trainer", "exact")}
    shift = rng.normal(0.0, 0.1, 50)
    now = {
        "exact": base["exact"] + shift,
        "trainer": base["trainer"] + shift + rng.normal(0.0, 0.01, 50),
        "engine": base["engine"] - shift,  # moves against the others
    }
    row = moves(base, now)
    assert row["mean_abs_move_exact"] == pytest.approx(np.abs(shift).mean())
    assert row["mean_abs_move_engine"] == pytest.approx(np.abs(shift).mean())
    # a correlation of the moves, not of the logprobs (which share nothing here)
    assert row["corr_engine_exact"] == pytest.approx(-1.0)
    assert row["corr_trainer_exact"] > 0.99
    assert row["corr_engine_trainer"] < -0.99
    gap = np.abs(now["engine"] - now["trainer"])
    assert row["gap_engine_trainer_max"] == pytest.approx(gap.max())
    assert row["gap_engine_trainer_mean"] == pytest.approx(gap.mean())


def test_bench_lora_is_a_target_with_its_numerics():
    args = build_parser().parse_args(["bench", "lora", "--numerics", "sgl-jax"])
    assert (args.target, args.numerics) == ("lora", "sgl-jax")
    assert build_parser().parse_args(["bench", "lora"]).numerics == "trainer"
