"""`compare --against vanilla` on the built-in model (engine-marked; it starts its own engine,
one per process, before the session rollout starts: tests/conftest.py)."""

import json

import pytest

pytestmark = pytest.mark.engine


def test_compare_against_vanilla_agrees_with_tunix(tmp_path):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout_apps.compare import CompareConfig, run, table

    if patches.current() is not None:
        pytest.skip("another engine is still running in this process")
    config = CompareConfig(against="vanilla", out=str(tmp_path), steps=2, show_progress=False)
    report = run(config)
    assert report["greedy"]["agreement"] == 1.0
    assert report["greedy"]["first_divergence"] == [None] * config.prompts
    for row in report["logprob_fidelity"].values():
        for side in ("sglang_jax", "vanilla"):
            assert row[side]["max_abs_diff"] <= 1e-4 and row[side]["tokens"] > 0
    d = report["distribution"]
    assert d["per_prompt"][0]["samples_per_side"] == config.tv_samples // 2
    # the same distribution: our distance to vanilla is within noise of our distance to us
    assert d["mean_tv_vs_other"] < d["mean_tv_ours_vs_ours"] + 0.1
    assert all(v > 0 for v in report["throughput_tokens_per_s"].values())
    assert set(report["grpo"]["final_reward"]) == {"sglang_jax", "vanilla"}
    assert len(report["grpo"]["reward"]["sglang_jax"]) == 2
    assert json.loads((tmp_path / "compare.json").read_text()) == json.loads(json.dumps(report))
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert "greedy agreement: 1.000" in table(report)
