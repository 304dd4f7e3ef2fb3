"""`check_exact.token_logps`: the exact reference's log-softmax, against `math.fsum` sums
written out here, over the whole vocabulary and over the tokenizer's ids only."""

from __future__ import annotations

import math

import numpy as np

from tunix_adapter.check_exact import token_logps


def test_token_logps_is_the_float64_log_softmax_of_each_token_over_the_ids_sampled_from():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((2, 3, 7)) * 30).astype(np.float32)
    tokens = [[1, 4, 0], [4, 2]]  # the second row ends early: its last position stays 0
    for valid in (None, 5):
        got = token_logps(logits, tokens, valid)
        width = valid or 7
        for i, row in enumerate(tokens):
            for j, token in enumerate(row):
                z = [float(x) for x in logits[i, j, :width]]
                top = max(z)
                want = z[token] - top - math.log(math.fsum(math.exp(x - top) for x in z))
                assert abs(got[i, j] - want) < 1e-12
        assert got[1, 2] == 0.0
