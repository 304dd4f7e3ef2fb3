"""`trainer_scores` and `trainer_logps` (tunix_adapter/scoring.py) in chunks of rows: where a
batch's logits exceed `SCORING_LOGITS_BYTES` the trainer scores it in chunks (the last one filled
with copies), and each row's logprobs and logits are those of the whole batch scored at once;
`trainer_logps` gives `trainer_scores`' logprobs (engine-marked: the session rollout's
completions, tunix's trainer-side logprobs)."""

from __future__ import annotations

import numpy as np
import pytest

from sgl_jax_rollout.tunix_compat import RolloutConfig
from tunix_adapter import scoring


def test_chunks_fill_the_last_one_and_keep_one_shape():
    rows = np.arange(10).reshape(5, 2)
    chunks = scoring.row_chunks(rows, 2)
    assert [c.tolist() for c in chunks] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [8, 9]]]
    assert scoring.row_chunks(rows, 5)[0] is rows
    budget = scoring.SCORING_LOGITS_BYTES
    assert scoring.chunk_rows(8, budget // 8) == 8  # all fit
    assert scoring.chunk_rows(8, budget // 3) == 3
    assert scoring.chunk_rows(8, 2 * budget) == 1  # one row at least


@pytest.mark.engine
def test_chunked_scores_are_the_whole_batchs(rollout, trainer, monkeypatch):
    from tunix_adapter.models import vocab_size

    prompts = [f"chunk probe {i}: the quick brown" for i in range(5)]
    config = RolloutConfig(max_tokens_to_generate=12, max_prompt_length=32, temperature=1.0, seed=3)
    out = rollout.generate(prompts, config)
    whole = scoring.trainer_scores(rollout, trainer, out, 1.0)
    width = max(len(t) for t in out.tokens)
    row_bytes = (len(out.left_padded_prompt_tokens[0]) + width) * vocab_size(trainer.config) * 4
    monkeypatch.setattr(scoring, "SCORING_LOGITS_BYTES", 2 * row_bytes)  # chunks of 2, 2, 1 + 1
    chunked = scoring.trainer_scores(rollout, trainer, out, 1.0)
    for a, b in zip(whole, chunked, strict=True):
        assert a.shape == b.shape and a.shape[0] == 5
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    logps = scoring.trainer_logps(rollout, trainer, out, 1.0)  # in the same chunks
    np.testing.assert_allclose(logps, chunked[0], rtol=0, atol=1e-6)
    assert np.isfinite(whole[0]).all() and np.abs(whole[0]).max() > 0
