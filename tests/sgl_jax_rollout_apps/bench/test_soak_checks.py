"""The soak's completion checks (`soak_checks.check_call`) on hand-made outputs: an
`ignore_eos` completion may end early only at its first sampled pad id (tunix reads every pad
as padding, so the rollout cuts the row there: `rollout_inputs.cut_at_pad`).

The rollout here is a test double (pad id, a tokenizer and `engine.score` only): the test is
about the soak's own checks, not the engine's output; the engine's soak is `test_soak.py`.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from sgl_jax_rollout_apps.bench import soak, soak_checks

PAD = 0
KIND = next(kind for kind in soak.CALLS if kind.name == "t1_ignore_eos")


def _rollout():
    tokenizer = types.SimpleNamespace(decode=lambda ids: " ".join(f"w{t}" for t in ids))
    engine = types.SimpleNamespace(
        tokenizer=tokenizer,
        score=lambda prompts, completions: [[-0.5] * len(c) for c in completions],
    )
    return types.SimpleNamespace(engine=engine, pad_id=lambda: PAD)


def _tally(completion: list[int]) -> soak_checks.Tally:
    config = soak._rollout_config(KIND, [], seed=0)
    out = types.SimpleNamespace(
        tokens=[np.array(completion)],
        logprobs=[np.full(len(completion), -0.5)],
        entropy=[np.ones(len(completion))],
        left_padded_prompt_tokens=np.array([[PAD, 5, 6]]),
    )
    tally = soak_checks.Tally()
    soak_checks.check_call(_rollout(), tally, 0, KIND, config, out, stop_ids={PAD, 2})
    return tally


@pytest.mark.parametrize(
    "completion, bad, ended",
    [
        ([7] * KIND.max_new, 0, "length"),
        ([7, 8, 2, 9, PAD], 0, "pad"),  # an ignored EOS inside, then the pad that cuts it
        ([7, 8, 9], 1, "pad"),  # early, and not at a pad: the engine lost tokens
        ([7, PAD, 8, PAD], 1, "pad"),  # not cut at its first pad
    ],
)
def test_an_ignore_eos_completion_ends_at_full_length_or_at_its_first_pad(completion, bad, ended):
    tally = _tally(completion)

    assert tally.bad_by_kind["early_end"] == bad, tally.failures
    assert dict(tally.ended_by) == {ended: 1}
