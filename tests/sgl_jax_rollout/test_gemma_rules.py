"""Gemma's request rules, on the tiny Gemma 2 replica, without an engine (the request policy
is our code; the engine is a stand-in holding the two numbers the policy reads of it, the
vocabulary size and the context length): every prompt carries exactly one BOS, whether the
text came from Gemma's chat template (which writes `<bos>` itself) or is plain;
`<end_of_turn>` is an EOS beside `<eos>` (generation_config.json's `[1, 107]`); the pad id is
Gemma's `<pad>` (0)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("gemma") / "g2", like="gemma-2-2b-it")


def test_one_bos_per_prompt_and_end_of_turn_stops(gemma_dir):
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
    policy = RequestPolicy(engine, tokenizer, eos, SamplingOptions(), seed=0)
    chat = raw.apply_chat_template(
        [{"role": "user", "content": "Say yes."}], tokenize=False, add_generation_prompt=True
    )
    assert chat.startswith("<bos><start_of_turn>user")
    for text in (chat, "plain text", "<bos><bos>twice"):
        ids = policy.prompt_ids(text, 128, 0)
        assert ids[0] == 2 and ids.count(2) == 1, (text, ids[:4])
