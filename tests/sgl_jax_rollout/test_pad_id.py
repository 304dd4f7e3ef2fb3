"""`choose_pad_id` / `pad_safe` (sgl_jax_rollout/pad_id.py) on HF tokenizers shaped like real
checkpoints' (built here from a word-level vocabulary: the rules read only special tokens,
lengths and the chat template), and tunix's own adapter and vanilla sampler reading the id."""

from __future__ import annotations

import pytest

SMOL_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}"
)


def _tokenizer(specials: list[str], words: int = 20, **tokens):
    """An HF fast tokenizer: `specials` first (ids 0..), then `words` plain words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(specials)}
    vocab.update({f"w{i}": len(specials) + i for i in range(words)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials[0]))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, **tokens)
    fast.add_special_tokens({"additional_special_tokens": specials})
    return fast


@pytest.fixture()
def smol_like():
    """SmolLM2's special tokens: pad = EOS = <|im_end|>, which the chat template writes."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<empty_output>"]
    tok = _tokenizer(
        specials, bos_token="<|im_start|>", eos_token="<|im_end|>", unk_token="<|endoftext|>"
    )
    tok.pad_token = "<|im_end|>"
    tok.chat_template = SMOL_TEMPLATE
    return tok


def test_pad_equal_to_eos_is_replaced_by_an_unused_special_token(smol_like):
    from sgl_jax_rollout.pad_id import choose_pad_id

    choice = choose_pad_id(smol_like, len(smol_like), stop_ids=[2])
    assert (choice.id, choice.token) == (4, "<empty_output>")
    assert "the tokenizer's pad '<|im_end|>' (2) is a stop id" in choice.why


def test_no_pad_takes_the_first_id_past_the_tokenizer_when_the_model_vocab_is_larger():
    from sgl_jax_rollout.pad_id import choose_pad_id

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>"]
    specials += ["<|end_header_id|>", "<|eot_id|>", "<|reserved_special_token_0|>"]
    tok = _tokenizer(specials, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    tok.chat_template = LLAMA3_TEMPLATE
    assert tok.pad_token_id is None
    padded = choose_pad_id(tok, len(tok) + 8, stop_ids=[1, 4])
    assert (padded.id, padded.token) == (len(tok), None)
    assert padded.why.startswith("the tokenizer has no pad")
    # Same vocabulary on both sides (Llama 3): the reserved token, never the template's ones.
    exact = choose_pad_id(tok, len(tok), stop_ids=[1, 4])
    assert (exact.id, exact.token) == (5, "<|reserved_special_token_0|>")
    assert tok.pad_token_id is None  # read, never set (tunix's adapter sets it to EOS)


def test_a_safe_own_pad_is_kept():
    from sgl_jax_rollout.pad_id import choose_pad_id

    tok = _tokenizer(["<unk>", "<pad>", "<s>", "</s>"], pad_token="<pad>", eos_token="</s>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] + '</s>' }}{% endfor %}"
    assert choose_pad_id(tok, len(tok), stop_ids=[3]).id == 1
    # The same pad id listed among the model's EOS ids (Qwen base: pad <|endoftext|>) is not.
    assert choose_pad_id(tok, len(tok) + 1, stop_ids=[3, 1]).id == len(tok)


def test_no_safe_id_and_bad_given_ids_raise_by_name(smol_like):
    from sgl_jax_rollout.pad_id import choose_pad_id

    tok = _tokenizer(["<unk>", "</s>"], eos_token="</s>", unk_token="<unk>")
    with pytest.raises(ValueError, match="pass pad_id="):
        choose_pad_id(tok, len(tok), stop_ids=[1])
    assert choose_pad_id(smol_like, len(smol_like), [2], pad_id=7).why == "given as pad_id"
    with pytest.raises(ValueError, match=r"pad_id must be an integer in \[0, 25\), got 25"):
        choose_pad_id(smol_like, 25, [2], pad_id=25)
    with pytest.raises(ValueError, match=r"must not be a stop id of the model \(\[2\]\), got 2"):
        choose_pad_id(smol_like, 25, [2], pad_id=2)


def test_tunix_reads_the_safe_pad_through_its_own_adapter_and_vanilla_sampler(smol_like):
    from sgl_jax_rollout.pad_id import PadSafeTokenizer, pad_safe
    from sgl_jax_rollout.tunix_compat import TokenizerAdapter

    safe = pad_safe(smol_like, len(smol_like), [2])
    # tunix's cluster and samplers wrap what they are given in an adapter of their own.
    wrapped = TokenizerAdapter(safe)
    assert (wrapped.pad_id(), wrapped.eos_id(), wrapped.bos_id()) == (4, 2, 1)
    assert wrapped.encode("w0 w1") == smol_like.encode("w0 w1")
    assert pad_safe(wrapped, len(smol_like), [2]) is safe  # unwrapped, not chosen again
    assert isinstance(pad_safe(wrapped, len(smol_like), [2], pad_id=3), PadSafeTokenizer)
    assert smol_like.pad_token_id == 2  # the user's tokenizer is left as it was
