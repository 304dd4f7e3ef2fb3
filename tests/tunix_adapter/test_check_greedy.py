"""`check`'s greedy row: exact argmax in float32; in bfloat16, a near-tie within the tolerance
counts as agreeing, a token further from the argmax does not."""

from __future__ import annotations

import numpy as np

from tunix_adapter.check_verdicts import _greedy_agrees


def test_a_near_tie_agrees_only_within_the_tolerance():
    logits = np.array(
        [
            [2.0, 1.95, 0.0],  # engine took 1: 0.05 below the argmax
            [2.0, 1.5, 0.0],  # engine took 1: 0.5 below
            [0.0, 3.0, 1.0],  # engine took the argmax
        ],
        dtype=np.float32,
    )
    tokens = np.array([1, 1, 1])
    assert _greedy_agrees(tokens, logits, near_tie=0.0).tolist() == [False, False, True]
    assert _greedy_agrees(tokens, logits, near_tie=0.1).tolist() == [True, False, True]
