"""`sgl-jax-rollout check` on the built-in model (engine-marked; its own engine, run before the
session rollout starts: tests/conftest.py).

The pre-flight passes where trainer and engine agree, and fails, naming the rows, where they
do not: the same engine with weights the trainer does not have, which the exact (float64)
reference then finds on the engine's side. The engine starts under
pytest's capture (`capsys`: a `sys.stderr` without a file descriptor, as in Jupyter), which
the `scheduler_faulthandler` patch makes survivable.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


def test_check_passes_on_agreeing_weights_and_fails_rows_on_diverged_ones(tiny_dir, capsys):
    from flax import nnx

    from sgl_jax_rollout_apps import cli
    from tunix_adapter import check

    assert cli.main(["check", "--model-path", str(tiny_dir), "--max-tokens", "16"]) == 0
    printed = capsys.readouterr()
    assert "after update_params (perturbed weights)" in printed.out and "FAIL" not in printed.out
    # each stage says itself as it starts, with the rows it sends (long work shows progress)
    stages = [line for line in printed.err.splitlines() if line.startswith("check: ")]
    assert len(stages) == 10, stages
    # the floor: float32 trainer against itself with other padding, far below the tolerance
    floor = [line for line in printed.out.splitlines() if line.startswith("floor: ")]
    assert len(floor) == 2 and all(float(line.split()[-3]) < 1e-5 for line in floor), floor
    # which RoPE phases the engine computes is said before any row (tiny_dir is a qwen3)
    assert stages[2] == "check: RoPE phases: tunix's qwen3 model's (timescale)", stages
    # a float32 engine is scored by a float32 trainer, and no bfloat16 rounding is said
    assert stages[3] == "check: the trainer computes in float32, the engine in float32", stages
    assert not any(line.startswith("check: rounding:") for line in stages), stages
    assert "check: greedy tokens against the trainer's argmax (2 prompts of 1025/" in printed.err

    config = check.CheckConfig(model_path=str(tiny_dir), prompt_tokens=1024, max_tokens=16)
    trainer, rollout, _ = check.build(config)
    try:
        # The engine serves other weights than the trainer holds: what a missed sync looks like.
        state = nnx.state(trainer, nnx.Param)
        rollout.update_params(check.perturbed(state, scale=0.05, seed=7))
        rows = {row.check: row for row in check.verdicts(config, rollout, trainer)}
    finally:
        rollout.shutdown()
    failed = {name for name, row in rows.items() if not row.ok}
    assert "logprob |diff| vs trainer, T=1.0" in failed
    assert "logprob |diff| vs trainer, T=0.7" in failed
    # The check's own sync realigns the two, so that row passes again.
    assert "after update_params (perturbed weights), T=1.0" not in failed
    assert rows["logprob |diff| vs trainer, T=1.0"].value > 1e-2
    # A float32 row above the tolerance is scored by tunix's model in float64 (the exact
    # reference): the engine is the side that is off; the trainer is within float32 rounding.
    assert "exact: engine vs float64 model, T=1.0" in failed
    assert rows["exact: engine vs float64 model, T=0.7"].value > 1e-2
    assert 0 < rows["exact: trainer vs float64 model, T=1.0"].value < 1e-5
