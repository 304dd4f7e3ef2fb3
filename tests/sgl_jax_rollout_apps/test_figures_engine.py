"""`sgl-jax-rollout figures` for real (engine-marked): the `check` source runs in a process of
its own on the built-in model, its table is read and the README's check figure judged, within
its noise."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


def test_the_check_figure_is_measured_again_within_its_noise(tmp_path):
    from sgl_jax_rollout_apps.figures import runner

    lines: list[str] = []
    report = runner.check_figures(tmp_path, only=["check"], progress=lines.append)

    assert report["sources"]["check"]["rc"] == 0, (tmp_path / "check" / runner.STDERR).read_text()
    (verdict,) = report["figures"]
    assert verdict["ok"], verdict
    assert 0 < verdict["measured"] <= 1e-4
    assert "sgl-jax-rollout check --model-path " in lines[0] and "{model}" not in lines[0]
    assert report["sources"]["make demo"] == {"left_out": "not asked for"}
