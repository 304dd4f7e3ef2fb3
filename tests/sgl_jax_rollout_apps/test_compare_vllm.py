"""`compare --against vllm` on a TPU (tpu-marked; skipped where no TPU is present).

Follows tunix's own vLLM rollout setup (`tunix.rl.rollout.vllm_rollout.VllmRollout` on the
trainer's model and mesh, the checkpoint directory as the vLLM model version, vLLM with its
TPU backend installed). Tolerances suit bf16 on both sides: greedy agreement >= 0.75 (bf16
ties flip argmaxes late in a completion) and logprob max |diff| against the trainer <= 0.1
(mean <= 0.02), since vLLM's and our kernels round differently from the trainer's.

Run on a TPU host: `python -m pytest -m tpu tests/sgl_jax_rollout_apps/test_compare_vllm.py`, with
`SGL_JAX_ROLLOUT_COMPARE_MODEL` set to a HF checkpoint directory and `SGL_JAX_ROLLOUT_PRESET`
to the slice's preset (default v5e-8).
"""

import os

import pytest

pytestmark = pytest.mark.tpu


def test_compare_against_vllm_on_tpu(tmp_path):
    from sgl_jax_rollout_apps.compare import CompareConfig, run

    model = os.environ.get("SGL_JAX_ROLLOUT_COMPARE_MODEL")
    if not model:
        pytest.skip("set SGL_JAX_ROLLOUT_COMPARE_MODEL to a HF checkpoint directory")
    config = CompareConfig(
        against="vllm",
        model_path=model,
        preset=os.environ.get("SGL_JAX_ROLLOUT_PRESET", "v5e-8"),
        out=str(tmp_path),
        steps=2,
        show_progress=False,
    )
    report = run(config)
    assert report["greedy"]["agreement"] >= 0.75
    for row in report["logprob_fidelity"].values():
        for side in ("sglang_jax", "vllm"):
            assert row[side]["max_abs_diff"] <= 0.1
            assert row[side]["mean_abs_diff"] <= 0.02
    assert report["distribution"]["mean_tv_vs_other"] < (
        report["distribution"]["mean_tv_ours_vs_ours"] + 0.1
    )
