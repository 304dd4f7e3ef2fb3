"""Gemma's request rules, on the tiny Gemma 2 replica, without an engine (the request policy
and the session are our code; the policy's engine is a stand-in holding the two numbers it
reads, the vocabulary size and the context length, and the session's sampler is
test_session's `FakeEngine`, a TEST DOUBLE replying with tokens that end in `<end_of_turn>`):
every prompt carries exactly one BOS, whether the text came from Gemma's chat template (which
writes `<bos>` itself) or is plain, a session's first prompt too; `<end_of_turn>` is an EOS
beside `<eos>` (generation_config.json's `[1, 107]`); the pad id is Gemma's `<pad>` (0); a
session goes on after a reply that ended with `<end_of_turn>`, and what Gemma's template
refuses (a system role, turns that do not alternate) is refused by name before the engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.sgl_jax_rollout.test_session import FakeEngine


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("gemma") / "g2", like="gemma-2-2b-it")


@pytest.fixture(scope="module")
def gemma(gemma_dir):
    """(the replica's HF tokenizer, the rollout's request policy on it)."""
    from transformers import AutoTokenizer

    from sgl_jax_rollout import rollout_inputs as inputs
    from sgl_jax_rollout.pad_id import pad_safe
    from sgl_jax_rollout.request_policy import RequestPolicy
    from sgl_jax_rollout.sampling.options import SamplingOptions
    from sgl_jax_rollout.tunix_compat import TokenizerAdapter

    raw = AutoTokenizer.from_pretrained(str(gemma_dir))
    eos = inputs.eos_ids(gemma_dir, TokenizerAdapter(raw).eos_id())
    assert eos == [1, 107] == [raw.eos_token_id, raw.convert_tokens_to_ids("<end_of_turn>")]
    tokenizer = pad_safe(raw, len(raw), eos)
    assert tokenizer.pad_id() == 0 == raw.pad_token_id
    engine = SimpleNamespace(vocab_size=len(raw), settings=SimpleNamespace(context_length=512))
    return raw, RequestPolicy(engine, tokenizer, eos, SamplingOptions(), seed=0)


def test_one_bos_per_prompt_and_end_of_turn_stops(gemma):
    raw, policy = gemma
    chat = raw.apply_chat_template(
        [{"role": "user", "content": "Say yes."}], tokenize=False, add_generation_prompt=True
    )
    assert chat.startswith("<bos><start_of_turn>user")
    for text in (chat, "plain text", "<bos><bos>twice"):
        (ids,) = policy.prompt_ids([text], 128)
        assert ids[0] == 2 and ids.count(2) == 1, (text, ids[:4])


def test_sessions_start_with_one_bos_and_go_on_after_end_of_turn(gemma):
    from sgl_jax_rollout.session import Session

    raw, policy = gemma
    bos, end_of_turn = raw.bos_token_id, raw.convert_tokens_to_ids("<end_of_turn>")
    engine = FakeEngine(end_of_turn)
    with Session(engine, raw, start=policy.with_bos) as s:
        s.complete("plain text")  # no BOS in the text: the session adds it
        (chat,) = s.chat([{"role": "user", "content": "Say yes."}])  # the template wrote one
        for call in engine.calls:
            assert call[0] == bos and call.count(bos) == 1, call[:4]
        (turn,) = s.chat_extend(chat, [{"role": "user", "content": "Again."}])
        call = engine.calls[-1]
        assert call[: len(chat.tokens)] == chat.tokens and chat.tokens[-1] == end_of_turn
        assert raw.decode(call[len(chat.tokens) :]) == (
            "\n<start_of_turn>user\nAgain.<end_of_turn>\n<start_of_turn>model\n"
        )
        assert turn.masked_tokens[: len(chat.tokens)] == chat.masked_tokens
        system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        with pytest.raises(ValueError, match="template refuses .*System role not supported"):
            s.chat(system)
        with pytest.raises(ValueError, match="template refuses .*must alternate"):
            s.chat_extend(turn, [{"role": "tool", "content": "42"}])
        assert len(engine.calls) == 3  # refused before the engine


def test_gemma4_stops_at_turn_end_and_keeps_a_system_turn(tmp_path):
    """The Gemma 4 replica: `<turn|>` (106) and `<|tool_response>` (50) stop beside `<eos>`
    (generation_config.json's `[1, 106, 50]`), one BOS per prompt, and its template's system
    turn (which Gemma 2's refuses) reaches the engine; `chat_extend` adds `<|turn>` turns."""
    from transformers import AutoTokenizer

    from sgl_jax_rollout import rollout_inputs as inputs
    from sgl_jax_rollout.pad_id import pad_safe
    from sgl_jax_rollout.request_policy import RequestPolicy
    from sgl_jax_rollout.sampling.options import SamplingOptions
    from sgl_jax_rollout.session import Session
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from sgl_jax_rollout.tunix_compat import TokenizerAdapter

    model_dir = make_tiny_model(tmp_path / "g4", like="gemma-4-31b-it")
    raw = AutoTokenizer.from_pretrained(str(model_dir))
    eos = inputs.eos_ids(model_dir, TokenizerAdapter(raw).eos_id())
    assert eos == [1, 106, 50]
    assert raw.convert_ids_to_tokens(eos) == ["<eos>", "<turn|>", "<|tool_response>"]
    tokenizer = pad_safe(raw, len(raw), eos)
    assert tokenizer.pad_id() == 0 == raw.pad_token_id
    engine = SimpleNamespace(vocab_size=len(raw), settings=SimpleNamespace(context_length=512))
    policy = RequestPolicy(engine, tokenizer, eos, SamplingOptions(), seed=0)
    for text in ("plain text", "<bos><|turn>user\nHi<turn|>\n<|turn>model\n"):
        (ids,) = policy.prompt_ids([text], 128)
        assert ids[0] == 2 and ids.count(2) == 1, (text, ids[:4])

    fake = FakeEngine(106)
    with Session(fake, raw, start=policy.with_bos) as s:
        system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        (chat,) = s.chat(system)
        assert raw.decode(fake.calls[0]) == (
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
        )
        s.chat_extend(chat, [{"role": "user", "content": "Again."}])
        assert raw.decode(fake.calls[-1][len(chat.tokens) :]) == (
            "\n<|turn>user\nAgain.<turn|>\n<|turn>model\n"
        )
