"""Gemma's end of turn on the engine, Gemma 2's and 3's `<end_of_turn>` and Gemma 4's `<turn|>`
(engine-marked; their own engines, started before the session rollout's: tests/conftest.py).

The random replicas almost never sample it, so the test first syncs it
weights under which that token outranks every other (an `update_params` of a tunix state,
as training would send): one residual dimension carries a constant from every token's
embedding, twice that from `<end_of_turn>`'s, and the final norm reads only that dimension.
Then, by default (no `eos_tokens`), a greedy completion with `min_new_tokens=3` is three
other tokens and `<end_of_turn>`, kept, with one logprob and one entropy per token: the
stop ids include it (min_new_tokens masks exactly the stop ids) and it ends the completion.
A session on the engine goes on after such a reply: `chat_extend` sends the reply, the
template's newline and the next user turn, and the prompt holds one BOS.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.engine


# replica -> (its end-of-turn token and id, what `chat_extend` adds after a reply, whether its
# norms scale by (1 + w) (Gemma 2 and 3) or w (Gemma 4), its dtype). Gemma 3 4B's is bfloat16:
# its text_config names no dtype, so the engine's "auto" must come from the top level.
REPLICAS = {
    "gemma-2-2b-it": (
        "<end_of_turn>",
        107,
        "\n<start_of_turn>user\nAgain.<end_of_turn>\n<start_of_turn>model\n",
        True,
        "float32",
    ),
    "gemma-3-4b-it": (
        "<end_of_turn>",
        106,
        "\n<start_of_turn>user\nAgain.<end_of_turn>\n<start_of_turn>model\n",
        True,
        "bfloat16",
    ),
    "gemma-4-31b-it": (
        "<turn|>",
        106,
        "\n<|turn>user\nAgain.<turn|>\n<|turn>model\n",
        False,
        "float32",
    ),
}


def end_of_turn_first(model, token: int, unit_offset: bool, constant: float = 4.0) -> None:
    """Sets `model`'s (tunix Gemma) weights so that `token` is every position's argmax."""
    import jax.numpy as jnp

    embedding = model.embedder.input_embedding
    table = np.asarray(embedding.value).copy()
    table[:, 0] = constant
    table[token, 0] = 2 * constant
    embedding.value = jnp.asarray(table, embedding.value.dtype)
    scale = np.full(model.final_norm.scale.value.shape, -1.0 if unit_offset else 0.0)
    scale[0] = 0.0 if unit_offset else 1.0  # the norm reads dimension 0 only
    model.final_norm.scale.value = jnp.asarray(scale, model.final_norm.scale.value.dtype)


@pytest.mark.parametrize("like", sorted(REPLICAS))
def test_end_of_turn_ends_a_completion_and_a_session_goes_on_after_it(like, tmp_path):
    import jax
    from flax import nnx

    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from tests.conftest import one_bucket_settings
    from tests.sgl_jax_rollout.test_rollout import config
    from tunix_adapter.models import load_tunix_model

    name, expected_id, added_turn, unit_offset, dtype = REPLICAS[like]
    model_dir = make_tiny_model(tmp_path / like, like=like, dtype=dtype)
    settings = one_bucket_settings(rows=2, tokens=256, context_length=256, total=1024)
    rollout = SglangJaxRollout(model_path=model_dir, engine_settings=settings)
    try:
        tokenizer = rollout.engine.tokenizer
        end_of_turn = tokenizer.convert_tokens_to_ids(name)
        assert end_of_turn == expected_id and rollout.eos_id() == 1
        # The embedding and the projections (the norms' weights are float32 either way).
        leaves = jax.tree_util.tree_leaves(rollout.engine.engine_state())
        assert {x.dtype.name for x in leaves if x.ndim == 2} == {dtype}
        # swa_mapping_not_static: no numpy static metadata on the CPU attention (a second
        # Gemma 4 engine in this process, after test_families_engine's, failed at its first step)
        assert "swa_index_mapping" not in vars(rollout.engine.model_runner.attn_backend)
        greedy = config(temperature=0.0, max_tokens_to_generate=12, max_prompt_length=64)
        before = rollout.generate(["Say yes."], greedy)
        assert end_of_turn not in before.tokens[0].tolist()  # the replica as built

        model = load_tunix_model(model_dir)
        end_of_turn_first(model, end_of_turn, unit_offset)
        rollout.update_params(nnx.state(model, nnx.Param))
        out = rollout.generate(["Say yes."], greedy, min_new_tokens=3)
        tokens = out.tokens[0].tolist()
        assert len(tokens) == 4 and tokens[-1] == end_of_turn, tokens
        assert end_of_turn not in tokens[:3]
        assert len(out.logprobs[0]) == len(out.entropy[0]) == 4

        with rollout.session(rollout_config=greedy) as session:
            (reply,) = session.chat([{"role": "user", "content": "Say yes."}], min_new_tokens=2)
            prompt = reply.tokens[: reply.metadata["turns"][-1][0]]
            assert reply.tokens[-1] == end_of_turn and prompt.count(2) == 1 == prompt.index(2) + 1
            (turn,) = session.chat_extend(reply, [{"role": "user", "content": "Again."}])
            start = len(reply.tokens)
            assert turn.tokens[:start] == reply.tokens
            added = tokenizer.decode(turn.tokens[start : turn.metadata["turns"][-1][0]])
            assert added == added_turn
            assert turn.tokens[-1] == end_of_turn
    finally:
        rollout.shutdown()
