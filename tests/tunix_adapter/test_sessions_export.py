"""Session trajectories exported for tunix: the agentic item and our GRPO batch.

The sessions here run on `FakeEngine` from tests/sgl_jax_rollout/test_session.py, a TEST DOUBLE
for the engine (deterministic tokens, logprobs and entropy); the tests are about our export code
only. The engine-backed export is checked against tunix's trainer-side logprobs in
tests/sgl_jax_rollout/test_session_engine.py.
"""

import logging

import numpy as np
import pytest
from transformers import AutoTokenizer

from sgl_jax_rollout.session import Session
from tests.sgl_jax_rollout.test_session import FakeEngine
from tunix_adapter.sessions import agentic_item, grpo_batch

PAD = 0


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def tool_session(tokenizer):
    """Two trajectories: a three-turn tool exchange, and a one-turn prompt. Env ids 40.. ."""
    engine = FakeEngine(tokenizer.eos_token_id)
    with Session(engine, tokenizer) as s:
        (node,) = s.complete([7, 8, 9])
        for turn in range(2):
            (node,) = s.complete(node.tokens + [40 + turn, 50 + turn])
        s.complete([11, 12])
        return node, s.trajectories()


def test_agentic_item_holds_what_tunix_agentic_learner_reads(tokenizer):
    node, (traj, _) = tool_session(tokenizer)
    item = agentic_item(
        traj, reward=0.5, policy_version=3, group_id="g", pair_index=1, original_input={"q": 1}
    )
    t = item.traj
    assert (item.group_id, item.pair_index) == ("g", 1)
    # prompt = tokens before the first sampled one; the conversation is every later token
    assert t["prompt_tokens"].tolist() == [7, 8, 9]
    assert t["prompt_tokens"].tolist() + t["conversation_tokens"].tolist() == node.tokens
    sampled = np.array(node.assistant_mask()[3:])
    assert t["conversation_masks"].tolist() == sampled.astype(int).tolist()
    assert t["conversation_masks"].tolist() == [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1]
    # sampled positions carry the engine's values; environment positions tunix's 0.0
    lp = np.asarray(node.logprobs[3:], np.float32)
    np.testing.assert_array_equal(t["old_logprobs"], np.where(sampled, lp, 0.0))
    np.testing.assert_array_equal(
        t["rollout_entropy"], np.where(sampled, np.asarray(node.entropy[3:], np.float32), 0.0)
    )
    assert t["old_logprobs"].dtype == np.float32
    assert t["trajectory_reward"] == 0.5 and t["policy_version"] == 3
    assert t["original_input"] == {"q": 1}


def test_grpo_batch_pads_like_tunix_and_keeps_values_aligned(tokenizer):
    node, trajs = tool_session(tokenizer)
    batch = grpo_batch(trajs, pad_id=PAD, max_prompt_length=4, max_response_length=16)
    assert batch.prompt_ids.tolist() == [[PAD, 7, 8, 9], [PAD, PAD, 11, 12]]
    assert batch.prompt_mask.tolist() == [[False, True, True, True], [False, False, True, True]]
    eos = tokenizer.eos_token_id
    assert batch.completion_ids[1].tolist() == [140, 204, eos] + [PAD] * 13
    assert batch.completion_mask[1].tolist() == [1, 1, 1] + [0] * 13
    # row 0: stripping the padding gives back the node's tokens
    row = batch.completion_ids[0][: len(node.tokens) - 3].tolist()
    assert [7, 8, 9] + row == node.tokens
    assert batch.completion_ids[0][len(row) :].tolist() == [PAD] * (16 - len(row))
    mask = batch.completion_mask[0].astype(bool)
    expected_lp = [lp for lp, m in zip(node.logprobs, node.assistant_mask(), strict=True) if m]
    np.testing.assert_allclose(batch.rollout_logprobs[0][mask], expected_lp)
    assert np.all(batch.rollout_logprobs[~batch.completion_mask.astype(bool)] == 0.0)
    assert np.all(batch.rollout_entropy[~batch.completion_mask.astype(bool)] == 0.0)
    assert batch.rollout_logprobs.dtype == np.float32 and batch.completion_ids.dtype == np.int32


def test_grpo_batch_truncates_with_warnings(tokenizer, caplog):
    _, trajs = tool_session(tokenizer)
    with caplog.at_level(logging.WARNING, logger="tunix_adapter.sessions"):
        batch = grpo_batch(trajs, pad_id=PAD, max_prompt_length=2, max_response_length=5)
    assert batch.prompt_ids.tolist() == [[8, 9], [11, 12]]
    assert batch.completion_ids.shape == (2, 5)
    assert batch.completion_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert "the first 1 are dropped" in caplog.text
    assert "conversation has 13 tokens, max_response_length 5: the last 8" in caplog.text


def test_export_errors_name_the_problem(tokenizer):
    node, (traj, _) = tool_session(tokenizer)
    with pytest.raises(ValueError, match=r"trajectories\[0\] lacks \['entropy'\]"):
        grpo_batch(
            [{k: v for k, v in traj.items() if k != "entropy"}],
            pad_id=PAD,
            max_prompt_length=4,
            max_response_length=4,
        )
    with pytest.raises(ValueError, match="one length"):
        grpo_batch(
            [dict(traj, logprobs=traj["logprobs"][:-1])],
            pad_id=PAD,
            max_prompt_length=4,
            max_response_length=4,
        )
    with pytest.raises(ValueError, match="no sampled token"):
        grpo_batch(
            [dict(traj, assistant_mask=[False] * len(traj["token_ids"]))],
            pad_id=PAD,
            max_prompt_length=4,
            max_response_length=4,
        )
    with pytest.raises(ValueError, match=r"conversation token 3 is the pad id 40"):
        grpo_batch([traj], pad_id=40, max_prompt_length=4, max_response_length=20)
    with pytest.raises(ValueError, match="max_response_length must be >= 1"):
        grpo_batch([traj], pad_id=PAD, max_prompt_length=4, max_response_length=0)
    with pytest.raises(ValueError, match="trajectories is empty"):
        grpo_batch([], pad_id=PAD, max_prompt_length=4, max_response_length=4)


def with_routing(traj, layers=2, k=2):
    """The trajectory with synthetic routed experts: token j's experts are (j, layer, slot)
    coded as 100 * j + 10 * layer + slot, so every row names its token."""
    j = np.arange(len(traj["token_ids"]))[:, None, None]
    code = 100 * j + 10 * np.arange(layers)[None, :, None] + np.arange(k)[None, None, :]
    return dict(traj, routed_experts=code.astype(np.int32))


@pytest.mark.parametrize(("prompt_width", "width"), [(4, 16), (2, 5)])
def test_grpo_batch_lays_session_routing_out_as_the_trainer_input(tokenizer, prompt_width, width):
    _, trajs = tool_session(tokenizer)
    batch = grpo_batch(
        [with_routing(t) for t in trajs],
        pad_id=PAD,
        max_prompt_length=prompt_width,
        max_response_length=width,
    )
    routing = batch.routed_experts
    assert routing.shape == (2, prompt_width + width, 2, 2) and routing.dtype == np.int32
    ids = np.concatenate([batch.prompt_ids, batch.completion_ids], axis=1)
    for i, traj in enumerate(trajs):
        start = int(np.argmax(traj["assistant_mask"]))
        prompt_len = min(start, prompt_width)
        completion_len = min(len(traj["token_ids"]) - start, width)
        for t in range(prompt_width + width):
            if prompt_width - prompt_len <= t < prompt_width:
                j = start - (prompt_width - t)  # left-padded prompt, cut from the left
            elif prompt_width <= t < prompt_width + completion_len:
                j = start + (t - prompt_width)  # right-padded conversation, cut from the right
            else:
                assert np.all(routing[i, t] == -1) and ids[i, t] == PAD
                continue
            assert ids[i, t] == traj["token_ids"][j]
            assert routing[i, t, 1, 0] == 100 * j + 10, (i, t)
    with pytest.raises(ValueError, match=r"trajectories \[1\] carry no routed_experts"):
        grpo_batch(
            [with_routing(trajs[0]), trajs[1]],
            pad_id=PAD,
            max_prompt_length=4,
            max_response_length=4,
        )
    bad = dict(trajs[0], routed_experts=np.zeros((3, 2, 2), np.int32))
    with pytest.raises(ValueError, match=r"routed_experts must be \[len\(token_ids\)"):
        grpo_batch([bad], pad_id=PAD, max_prompt_length=4, max_response_length=4)
    assert (
        grpo_batch(trajs, pad_id=PAD, max_prompt_length=4, max_response_length=4).routed_experts
        is None
    )
