"""`bench grpo`'s arithmetic (a worker's timings to medians, shares and ratios) and its flags;
the workers themselves train on the engine (run by `sgl-jax-rollout bench grpo`)."""

import pytest

from sgl_jax_rollout_apps.bench.grpo_bench import WORKLOADS, ratios, summary


def test_summary_takes_the_median_step_and_each_phases_share_of_the_sum():
    times = {
        "step_s": [2.0, 4.0, 3.0],
        "phases_s": {"rollout": [1.0, 2.0, 1.5], "weight_sync": [0.5, 0.5, 0.5]},
    }
    got = summary(times)
    assert got["step_s_median"] == 3.0
    assert got["phase_share"]["rollout"] == pytest.approx(4.5 / 9)
    assert got["phase_share"]["weight_sync"] == pytest.approx(1.5 / 9)
    assert got["phase_share"]["other"] == pytest.approx(3.0 / 9)


def test_ratios_are_each_variants_step_over_ours_and_skip_failed_ones():
    variants = {
        "ours_rollout_old": {"step_s_median": 2.0},
        "vanilla": {"step_s_median": 3.0},
        "tunix_sglang_jax": {"failed": "TypeError: ..."},
    }
    assert ratios(variants) == {"vanilla_over_ours_rollout_old": pytest.approx(1.5)}


def test_every_workload_has_the_reference_variant():
    for passes, variants in WORKLOADS.values():
        assert passes >= 1 and "ours_rollout_old" in variants


@pytest.mark.parametrize(
    ("target", "steps", "lowest"), [("grpo", "2", 3), ("sampler", "19", 20), ("agentic", "2", 3)]
)
def test_steps_below_each_targets_floor_exit_2(target, steps, lowest, capsys):
    from sgl_jax_rollout_apps.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["bench", target, "--steps", steps])
    assert exited.value.code == 2
    assert f"--steps must be >= {lowest} for bench {target}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["agentic", "--tokens", "0"], "--tokens must be in [1, 1024], got 0"),
        (["agentic", "--tokens", "1025"], "--tokens must be in [1, 1024], got 1025"),
        (["grpo", "--tokens", "64"], "--tokens applies to bench agentic, not bench grpo"),
    ],
)
def test_agentic_tokens_out_of_range_or_on_another_target_exit_2(argv, message, capsys):
    from sgl_jax_rollout_apps.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["bench", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_workers_pool_each_variants_steps_in_turn_and_a_failure_fails_it():
    from sgl_jax_rollout_apps.bench.grpo_bench import _pooled

    first = {"step_s": [1.0, 2.0], "phases_s": {"rollout": [0.5, 1.0]}}
    second = {"step_s": [3.0], "phases_s": {"rollout": [1.5]}}
    pooled = _pooled(_pooled(None, first), second)
    assert pooled == {"step_s": [1.0, 2.0, 3.0], "phases_s": {"rollout": [0.5, 1.0, 1.5]}}
    assert summary(pooled)["step_s_median"] == 2.0
    failed = {"failed": "ValueError: x"}
    assert _pooled(pooled, failed) == failed
    assert _pooled(failed, first) == failed


def test_variants_are_checked_by_name_and_the_reference_always_runs(capsys):
    from sgl_jax_rollout_apps.bench.grpo_bench import check_variants
    from sgl_jax_rollout_apps.cli import main

    assert check_variants(("vanilla",)) == ("ours_rollout_old", "vanilla")
    assert "tunix_sglang_jax" in check_variants(None)
    with pytest.raises(ValueError, match="unknown bench grpo variant"):
        check_variants(("vanila",))
    for flags, message in (
        (["--variants", "vanila"], "--variants: unknown bench grpo variant(s) ['vanila']"),
        (["--workers", "0"], "--workers must be >= 1, got 0"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["bench", "grpo", *flags])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
