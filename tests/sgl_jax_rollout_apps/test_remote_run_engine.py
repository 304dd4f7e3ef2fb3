"""`sgl-jax-rollout remote-run` as a user runs it, under tunix main: two of our rollout workers
(tunix's `RolloutWorker` on `SglangJaxSampler`), each its own process served by tunix's gRPC
remote execution on localhost, an orchestrator loop over them, and a weight-sync round between
the two epochs with the weights sent from this process. Every completion matches the trainer's
scores under the weights of its epoch, and not under the previous ones (the round reached both
workers); the workers exit 0 and free their ports."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.tunix_main]


def test_remote_run_over_grpc_aligns_every_epoch_and_frees_its_ports(capsys):
    from sgl_jax_rollout_apps import cli

    code = cli.main(["remote-run", "--workers", "2", "--epochs", "2"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"], report
    assert report["worker_exit_codes"] == [0, 0] and report["ports_free"]
    first, second = report["epochs"]
    for epoch in (first, second):
        assert epoch["rows"] == 4 and epoch["tokens"] >= 16, epoch
        assert epoch["max_abs_logprob_diff"] <= 1e-4, epoch
    assert [r["phase"] for r in second["worker_rounds"]] == ["committed", "committed"]
    assert {r["req_id"] for r in second["worker_rounds"]} == {"round-1"}
    assert second["previous_weights_max_abs_diff"] > 1e-2, second
