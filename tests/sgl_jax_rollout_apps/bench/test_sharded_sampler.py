"""`bench sampler`'s `sharded` section (compiled programs on 8 simulated CPU devices, in a
subprocess): the gathered sampler's all-gather of the logits is measured as such, the
vocabulary-parallel sampler moves >= 100x fewer bytes per call and does about 1/tp of the
single-device work per device (issue 19's targets, from the HLO, not from time)."""

from sgl_jax_rollout_apps.bench.sampler_bench import VOCAB, _sharded


def test_vocab_parallel_moves_per_row_values_and_splits_the_work():
    report = _sharded()
    for rows in ("64", "256"):
        for tp in (4, 8):
            entry = report[rows][f"tp{tp}"]
            gathered, ours = entry["ours_gathered"], entry["ours_vocab_parallel"]
            assert gathered["min_per_call"] == gathered["max_per_call"] == int(rows) * VOCAB * 4
            assert gathered["max_per_call"] >= 100 * ours["max_per_call"]
            assert 0 < ours["min_per_call"] <= ours["max_per_call"]
            single = report[rows]["single_device"]
            assert ours["bytes_accessed"] <= 1.5 * single["bytes_accessed"] / tp
            assert ours["flops"] <= 1.5 * single["flops"] / tp
