"""Managed sessions: the tracking logic, against a deterministic in-test generator.

`FakeEngine` is a TEST DOUBLE for the engine: it plays the engine's role (returns tokens with
a logprob and an entropy each) so that these CI tests exercise only our tracking code. The
engine-backed session is tested in the engine-marked tests.
"""

import pytest
from transformers import AutoTokenizer

from sgl_jax_rollout.session import MASK_ID, Sampled, Session


class FakeEngine:
    """Deterministic: sample k of a call is [100 + 10 * call + k, 200 + call] + ends."""

    def __init__(self, eos: int):
        self.eos = eos
        self.calls: list[list[int]] = []

    def __call__(self, prompt_ids, n, overrides):
        self.calls.append(list(prompt_ids))
        c = len(self.calls)
        out = []
        for k in range(n):
            tokens = [100 + 10 * c + k, 200 + c, self.eos]
            out.append(
                Sampled(
                    tokens=tokens,
                    logprobs=[-0.1 * (c + k), -0.2, -0.3],
                    entropy=[1.0 + c, 2.0 + k, 0.5],
                    finish_reason="stop",
                )
            )
        return out


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture
def engine(tokenizer):
    return FakeEngine(tokenizer.eos_token_id)


def test_masks_and_fills_follow_design_section_4(tokenizer, engine):
    with Session(engine, tokenizer) as s:
        (node,) = s.complete([7, 8, 9])
    assert node.tokens == [7, 8, 9, 110, 201, engine.eos]
    assert node.masked_tokens == [MASK_ID] * 3 + [110, 201, engine.eos]
    assert node.logprobs == [1.0, 1.0, 1.0, -0.1, -0.2, -0.3]
    assert node.entropy == [0.0, 0.0, 0.0, 2.0, 2.0, 0.5]
    assert node.metadata == {"turns": [(3, 6)], "finish_reasons": ["stop"]}
    assert node.full_text == tokenizer.decode(node.tokens, skip_special_tokens=False)
    assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs) == len(node.entropy)


def test_token_prefix_extends_the_node_in_place_and_masks_the_environment(tokenizer, engine):
    with Session(engine, tokenizer) as s:
        (first,) = s.complete([7, 8])
        env = [30, 31]
        (second,) = s.complete(first.tokens + env)
        assert engine.calls[1] == first.tokens + env
        assert second.key == first.key and list(s.state()) == [first.key]
        assert second.masked_tokens[: len(first.tokens)] == first.masked_tokens
        assert second.masked_tokens[len(first.tokens) : len(first.tokens) + 2] == [MASK_ID] * 2
        assert second.logprobs[len(first.tokens) : len(first.tokens) + 2] == [1.0, 1.0]
        assert second.metadata["turns"] == [(2, 5), (7, 10)]
        (other,) = s.complete([50, 51])  # extends nothing: a new node
        assert other.key != second.key and set(s.state()) == {second.key, other.key}


def test_tree_mode_keeps_every_node_linked_to_its_parent(tokenizer, engine):
    with Session(engine, tokenizer, track_tree=True) as s:
        (root,) = s.complete([7, 8])
        children = s.complete(root.tokens + [40], n=2)
        (grandchild,) = s.complete(children[1].tokens + [41])
        state = s.state()
    assert set(state) == {root.key, children[0].key, children[1].key, grandchild.key}
    assert [c.parent for c in children] == [root.key, root.key]
    assert grandchild.parent == children[1].key
    assert state[root.key].tokens == [7, 8, 110, 201, engine.eos]  # kept as it was
    assert [t["key"] for t in s.trajectories()] == [children[0].key, grandchild.key]


def test_n_branches_into_adjacent_nodes_in_default_mode(tokenizer, engine):
    with Session(engine, tokenizer) as s:
        (root,) = s.complete([7])
        branches = s.complete(root.tokens + [40], n=3)
    assert len({b.key for b in branches}) == 3 and root.key not in s.state()
    assert [b.tokens[-3] for b in branches] == [120, 121, 122]
    assert all(b.tokens[: len(root.tokens)] == root.tokens for b in branches)


def test_three_turn_tool_conversation_keeps_every_sampled_token(tokenizer, engine):
    messages = [{"role": "user", "content": "what is the weather"}]
    with Session(engine, tokenizer) as s:
        turns = []
        for turn in range(3):
            (node,) = s.chat(messages)
            sampled = node.tokens[node.metadata["turns"][-1][0] :]
            turns.append(sampled)
            # the assistant reply as the template renders it, then a tool result
            reply = tokenizer.decode(sampled[:-1], skip_special_tokens=False)
            messages = messages + [
                {"role": "assistant", "content": reply},
                {"role": "tool", "content": f"result {turn}"},
            ]
        final = node
    assert len(engine.calls) == 3
    # the final tokens are the concatenation of every turn's prompt suffix and sampled tokens
    rebuilt, start = [], 0
    for (a, b), sampled in zip(final.metadata["turns"], turns, strict=True):
        rebuilt += final.tokens[start:a] + sampled
        assert final.tokens[a:b] == sampled  # never re-tokenised
        assert all(t != MASK_ID for t in final.masked_tokens[a:b])
        assert all(t == MASK_ID for t in final.masked_tokens[start:a])
        start = b
    assert rebuilt == final.tokens
    assert len(final.tokens) == len(final.masked_tokens) == len(final.logprobs)
    assert len(final.logprobs) == len(final.entropy)
    trajectory = s.trajectories()[0]
    assert trajectory["token_ids"] == final.tokens
    assert sum(trajectory["assistant_mask"]) == sum(len(t) for t in turns)


def test_clear_errors(tokenizer, engine):
    session = Session(engine, tokenizer)
    with pytest.raises(RuntimeError, match="not open"):
        session.complete([1])
    with session as s:
        with pytest.raises(ValueError, match="role must be one of"):
            s.chat([{"role": "wizard", "content": "hi"}])
        with pytest.raises(ValueError, match="n must be"):
            s.complete([1], n=0)
    with pytest.raises(RuntimeError, match="not open"):
        session.complete([1])
    with pytest.raises(RuntimeError, match="has ended"):
        session.__enter__()
    no_template = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    no_template.chat_template = None
    with Session(engine, no_template) as s, pytest.raises(ValueError, match="chat template"):
        s.chat([{"role": "user", "content": "hi"}])
