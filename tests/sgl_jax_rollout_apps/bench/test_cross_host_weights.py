"""`bench weights`' `cross_host` section (two simulated hosts under `sgl-jax-rollout launch`):
a trainer spanning both processes' 8 devices reaches each host's 2 engine devices with the
checkpoint's exact values, no engine device holds more than its half of the model (plus the
replicated norms), and the compiled program moves less than the naive replicate-everywhere
copy (bytes from the HLO, not from time)."""

from sgl_jax_rollout.tiny_model import default_model_dir
from sgl_jax_rollout_apps.bench.rollout_bench import _cross_host_weights


def test_weights_spanning_hosts_reach_each_engine_split_and_exact():
    report = _cross_host_weights(default_model_dir(), runs=1)
    assert (report["processes"], report["devices"], report["engine_devices_per_host"]) == (2, 8, 2)
    assert report["exact"]
    model = report["model_bytes"]
    assert report["largest_piece_bytes"] <= report["largest_leaf_bytes"] // 2
    assert report["engine_device_bytes_max"] <= 0.55 * model  # half, plus norms
    assert 0 < report["collective_bytes_per_device"] < model
    assert (
        report["replicate_everywhere_collective_bytes_per_device"]
        > (report["collective_bytes_per_device"])
    )
