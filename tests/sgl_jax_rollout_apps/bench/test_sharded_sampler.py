"""`bench sampler`'s `sharded` section (compiled programs on 8 simulated CPU devices, in a
subprocess): the gathered sampler's all-gather of the logits is measured as such, the
vocabulary-parallel sampler moves >= 100x fewer bytes per call and does about 1/tp of the
single-device work per device (issue 19's targets, from the HLO, not from time), at Gemma 3's
vocabulary of 262,144 (`bench sampler --vocab 262144`; the default is Qwen's 151,936)."""

import pytest

from sgl_jax_rollout_apps.bench.sampler_bench import _sharded

VOCAB = 262_144


def test_vocab_parallel_moves_per_row_values_and_splits_the_work():
    report = _sharded(VOCAB)
    assert report["vocab"] == VOCAB
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


@pytest.mark.parametrize("vocab", ["1000", "262145", "2097152"])
def test_a_vocab_out_of_range_or_not_a_multiple_of_8_exits_2_naming_the_flag(vocab, capsys):
    from sgl_jax_rollout_apps.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["bench", "sampler", "--vocab", vocab])
    assert exited.value.code == 2
    assert "--vocab must be a multiple of 8 in [1,024, 1,048,576]" in capsys.readouterr().err
