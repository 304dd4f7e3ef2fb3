"""Managed sessions: the tracking logic, against a deterministic in-test generator.

`FakeEngine` is a TEST DOUBLE for the engine: it plays the engine's role (returns tokens with
a logprob and an entropy each) so that these CI tests exercise only our tracking code. The
engine-backed session is tested in the engine-marked tests.
"""

import logging

import numpy as np
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


# Qwen3's history rule, trimmed: an assistant turn before the last user message loses its
# <think> block; an assistant turn after it keeps one, written empty when it is the last message.
QWEN3_LIKE_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}"
    "{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}"
    "{%- set content = m['content'].split('</think>')[-1] %}"
    "{%- set reasoning = m['content'].split('</think>')[0].split('<think>')[-1] "
    "if '</think>' in m['content'] else '' %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>' + reasoning + '</think>' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
WEATHER = [{"role": "user", "content": "what is the weather"}]


class ThinkingEngine(FakeEngine):
    """FakeEngine whose replies reason first, as Qwen3's do: <think> a </think> b <|im_end|>."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer.eos_token_id)
        self.think, self.think_end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])

    def __call__(self, prompt_ids, n, overrides):
        return [
            Sampled(
                tokens=[self.think, s.tokens[0], self.think_end, *s.tokens[1:]],
                logprobs=[-0.5, s.logprobs[0], -0.5, *s.logprobs[1:]],
                entropy=[0.5, s.entropy[0], 0.5, *s.entropy[1:]],
                finish_reason=s.finish_reason,
            )
            for s in super().__call__(prompt_ids, n, overrides)
        ]


@pytest.fixture(scope="module")
def qwen3_like(tiny_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.chat_template = QWEN3_LIKE_TEMPLATE
    return tokenizer


def reply_of(node, tokenizer, skip_special_tokens):
    """The last sampled turn as text, without its EOS (the template writes its own)."""
    a, b = node.metadata["turns"][-1]
    return tokenizer.decode(node.tokens[a : b - 1], skip_special_tokens=skip_special_tokens)


def mismatch(caplog):
    return [r.getMessage() for r in caplog.records if "extends no node" in r.getMessage()]


@pytest.mark.parametrize("template", ["tiny", "qwen3_like"])
def test_rerendered_chat_that_differs_from_the_sampled_text_warns_where(
    template, tokenizer, qwen3_like, caplog
):
    # tiny: the reply decoded with skip_special_tokens=True loses <think> and </think>;
    # qwen3_like: the template drops the earlier <think> block itself.
    tok = {"tiny": tokenizer, "qwen3_like": qwen3_like}[template]
    engine = ThinkingEngine(tok)
    with Session(engine, tok) as s, caplog.at_level(logging.WARNING):
        (node,) = s.chat(WEATHER)
        reply = reply_of(node, tok, skip_special_tokens=template == "tiny")
        history = WEATHER + [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "and tomorrow?"},
        ]
        (second,) = s.chat(history)
    rendered = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    at = len(tok.decode(node.tokens[: node.metadata["turns"][0][0]]))  # where the reply begins
    assert node.full_text[at:].startswith("<think>") and rendered[:at] == node.full_text[:at]
    assert not rendered[at:].startswith("<think>")
    (message,) = mismatch(caplog)
    assert f"the closest, node {node.key!r}, differs from it at character {at}:" in message
    snippets = f"node has {node.full_text[at : at + 40]!r} vs prompt has {rendered[at : at + 40]!r}"
    assert snippets in message
    assert "re-tokenised and masked as prompt" in message and "chat_extend" in message
    # what the warning is about: a new root whose only sampled turn is the second one
    assert second.key != node.key and len(second.metadata["turns"]) == 1
    assert engine.calls[1] == second.tokens[: second.metadata["turns"][0][0]]


def test_strict_session_raises_the_warning_instead_and_does_not_sample(tokenizer, caplog):
    def second_turn(session):
        (node,) = session.chat(WEATHER)
        reply = reply_of(node, tokenizer, skip_special_tokens=True)
        session.chat(WEATHER + [{"role": "assistant", "content": reply}])
        return node

    with Session(ThinkingEngine(tokenizer), tokenizer) as s, caplog.at_level(logging.WARNING):
        second_turn(s)
    (warning,) = mismatch(caplog)
    engine = ThinkingEngine(tokenizer)
    with Session(engine, tokenizer, strict=True) as s:
        with pytest.raises(ValueError) as raised:
            second_turn(s)
        (node,) = s.state().values()
        at = node.metadata["turns"][0][0]
        with pytest.raises(ValueError, match=f"node 'n0', differs from it at token {at}: node "):
            s.complete(node.tokens[:at] + [7])
    assert str(raised.value) == warning
    at_char = len(tokenizer.decode(node.tokens[:at]))
    assert f"differs from it at character {at_char}: node has '<think>" in warning
    assert len(engine.calls) == 1 and list(s.state()) == [node.key]


def test_token_prompt_that_extends_no_node_warns_with_the_first_differing_token(
    tokenizer, engine, caplog
):
    with Session(engine, tokenizer) as s, caplog.at_level(logging.WARNING):
        (node,) = s.complete([7, 8])
        s.complete([7, 8, 110, 999])
    (message,) = mismatch(caplog)
    assert f"node {node.key!r}, differs from it at token 3: node has [201, {engine.eos}] vs " in (
        message
    )
    assert "prompt has [999]." in message


def test_first_turn_and_prompts_that_extend_a_node_do_not_warn(tokenizer, engine, caplog):
    with Session(engine, tokenizer) as s, caplog.at_level(logging.WARNING):
        (node,) = s.chat(WEATHER)
        history = WEATHER + [{"role": "assistant", "content": reply_of(node, tokenizer, False)}]
        (node,) = s.chat(history + [{"role": "tool", "content": "sunny"}])
        (node,) = s.complete(node.tokens + [30])
        assert len(node.metadata["turns"]) == 3
    with Session(engine, tokenizer, strict=True) as s:
        s.complete([7, 8])  # the first request of a session extends nothing, and may not
    assert caplog.records == []


def test_chat_extend_appends_the_template_rendering_of_the_new_messages(tokenizer, engine):
    new = [{"role": "tool", "content": "sunny"}, {"role": "user", "content": "and tomorrow?"}]
    with Session(engine, tokenizer) as s:
        (node,) = s.chat(WEATHER)
        (extended,) = s.chat_extend(node.key, new)
        assert list(s.state()) == [node.key] == [extended.key]  # extended in place
    prompt, length = engine.calls[1], len(node.tokens)
    assert prompt[:length] == node.tokens
    # The suffix is the new part of the template's own rendering of the whole conversation
    # (this template does not rewrite history, so the whole rendering extends the node).
    history = WEATHER + [{"role": "assistant", "content": reply_of(node, tokenizer, False)}]
    full = tokenizer.apply_chat_template(history + new, tokenize=False, add_generation_prompt=True)
    assert full.startswith(node.full_text)
    assert prompt[length:] == tokenizer.encode(full[len(node.full_text) :])
    assert tokenizer.decode(prompt[length:]) == (
        "\n<|im_start|>tool\nsunny<|im_end|>\n"
        "<|im_start|>user\nand tomorrow?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert extended.tokens[: len(prompt)] == prompt
    assert extended.masked_tokens[:length] == node.masked_tokens  # sampled tokens kept
    assert extended.masked_tokens[length : len(prompt)] == [MASK_ID] * (len(prompt) - length)
    assert extended.logprobs[:length] == node.logprobs
    assert extended.logprobs[length : len(prompt)] == [1.0] * (len(prompt) - length)
    assert extended.metadata["turns"] == node.metadata["turns"] + [(len(prompt), len(prompt) + 3)]


def test_chat_extend_keeps_reasoning_a_template_would_drop(qwen3_like, caplog):
    engine = ThinkingEngine(qwen3_like)
    with Session(engine, qwen3_like, strict=True) as s, caplog.at_level(logging.WARNING):
        (node,) = s.chat(WEATHER)
        (extended,) = s.chat_extend(node, [{"role": "user", "content": "and tomorrow?"}])
    prompt = engine.calls[1]
    assert prompt[: len(node.tokens)] == node.tokens  # <think> ... </think> as sampled
    assert qwen3_like.decode(prompt[len(node.tokens) :]) == (
        "\n<|im_start|>user\nand tomorrow?<|im_end|>\n<|im_start|>assistant\n"
    )
    a, b = node.metadata["turns"][0]
    assert extended.key == node.key and extended.masked_tokens[a:b] == node.tokens[a:b]
    assert extended.tokens[a] == engine.think and caplog.records == []


def test_chat_extend_closes_a_reply_that_did_not_end_with_the_end_of_turn(tokenizer):
    engine = FakeEngine(eos=57)  # a reply cut by max_tokens: no <|im_end|>
    with Session(engine, tokenizer) as s:
        (node,) = s.chat(WEATHER)
        s.chat_extend(node, [{"role": "tool", "content": "sunny"}], n=2)
    assert tokenizer.decode(engine.calls[1][len(node.tokens) :]) == (
        "<|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_extend_errors_name_the_node_and_the_cause(tokenizer, engine):
    tool = [{"role": "tool", "content": "sunny"}]
    with Session(engine, tokenizer, track_tree=True) as s:
        (root,) = s.chat(WEATHER)
        s.chat_extend(root, tool)
        with pytest.raises(ValueError, match="node 'n0' is not a current leaf"):
            s.chat_extend(root, tool)
        with pytest.raises(ValueError, match="no node 'n9' in this session"):
            s.chat_extend("n9", tool)
        with pytest.raises(ValueError, match=r"messages\[0\]: role must be one of"):
            s.chat_extend("n1", [{"role": "wizard", "content": "hi"}])
        with pytest.raises(ValueError, match="at least one new message"):
            s.chat_extend("n1", [])
    with Session(engine, tokenizer) as s:
        (first,) = s.chat(WEATHER)
        s.chat_extend(first, tool)  # same key, new tokens: `first` is out of date
        with pytest.raises(ValueError, match="node 'n0' is not a current leaf"):
            s.chat_extend(first, tool)
    odd = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    odd.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
        "{{ '<|im_end|>' if loop.last else '\\n' }}{% endfor %}"
    )
    with Session(engine, odd) as s:
        (node,) = s.chat(WEATHER)
        with pytest.raises(ValueError, match="ends an assistant turn with '<|im_end|>' when"):
            s.chat_extend(node, tool)
    assert len(engine.calls) == 5


def test_token_ids_outside_the_vocabulary_raise_before_the_engine(tokenizer, engine):
    with Session(engine, tokenizer, vocab_size=64) as s:
        for prompt, error in [
            ([7, 64], r"prompt\[1\] = 64: a token id must be an integer in \[0, 64\)"),
            ([-1, 7], r"prompt\[0\] = -1: .* in \[0, 64\)"),
            ([7, True], r"prompt\[1\] = True: "),
            ([7.0], r"prompt\[0\] = 7.0: "),
            (["7"], r"prompt\[0\] = '7': "),
            (np.array([3, 1], dtype=bool), r"prompt\[0\] = np.True_: "),
        ]:
            with pytest.raises(ValueError, match=error):
                s.complete(prompt)
        assert engine.calls == []
        s.complete(np.array([0, 63]))
        assert engine.calls == [[0, 63]] and all(type(t) is int for t in engine.calls[0])
    with Session(engine, tokenizer) as s, pytest.raises(ValueError, match="integer >= 0"):
        s.complete([5, -2])
