"""A managed three-turn chat on the built-in model (engine-marked).

It starts its own engine (one engine per process), once the session rollout is shut down
(`after_session_engine`, tests/conftest.py).
"""

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.after_session_engine]


@pytest.mark.parametrize("page_size", [1, 64])  # 64: the TPU presets' page size
def test_three_turn_chat_stays_aligned_with_rescoring(tiny_dir, trainer, page_size):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.rollout_inputs import left_pad
    from sgl_jax_rollout.session import MASK_ID
    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from tests.conftest import small_engine_settings
    from tests.sgl_jax_rollout.test_rollout import trainer_logps
    from tunix_adapter.sessions import grpo_batch

    if patches.current() is not None:
        pytest.skip("another engine is still running in this process")
    rollout = SglangJaxRollout(
        model_path=tiny_dir, engine_settings=small_engine_settings(page_size=page_size)
    )
    # temperature 1, no truncation: processed logprobs are the model's own log-softmax
    config = RolloutConfig(max_tokens_to_generate=12, temperature=1.0, top_p=1.0, seed=3)
    try:
        # strict: a turn that failed to extend the previous node would raise
        with rollout.session(track_tree=True, rollout_config=config, strict=True) as s:
            (node,) = s.chat([{"role": "user", "content": "what is the weather"}])
            for turn in range(2):
                tool = {"role": "tool", "content": f"result {turn}"}
                (child,) = s.chat_extend(node, [tool])
                assert child.tokens[: len(node.tokens)] == node.tokens
                node = child
            nodes = s.state()
            (trajectory,) = s.trajectories()
        assert len(nodes) == 3  # tree mode: one node per turn, each the parent of the next
        for n in nodes.values():
            assert len(n.tokens) == len(n.masked_tokens) == len(n.logprobs) == len(n.entropy)
        final = node
        turns = final.metadata["turns"]
        assert len(turns) == 3
        sampled = np.array([m != MASK_ID for m in final.masked_tokens])
        assert np.all(np.asarray(final.logprobs)[~sampled] == 1.0)
        assert np.all(np.asarray(final.entropy)[~sampled] == 0.0)

        # get_per_token_logps on the final sequence, one row per turn: the prompt is everything
        # before the turn, the completion the turn (it ends at its own EOS, as tunix cuts).
        width = max(b - a for a, b in turns)
        prompts = left_pad([final.tokens[:a] for a, _ in turns], turns[-1][0], rollout.pad_id())
        completions = np.full((3, width), rollout.pad_id(), np.int32)
        for i, (a, b) in enumerate(turns):
            completions[i, : b - a] = final.tokens[a:b]
        scored = np.asarray(rollout.get_per_token_logps(jnp.asarray(prompts), completions))
        for i, (a, b) in enumerate(turns):
            np.testing.assert_allclose(scored[i, : b - a], final.logprobs[a:b], atol=1e-4)

        # The exported GRPO batch, scored by tunix's trainer on the same weights in one pass
        # over the whole conversation (environment tokens included), matches under the mask.
        batch = grpo_batch(
            [trajectory], pad_id=rollout.pad_id(), max_prompt_length=64, max_response_length=128
        )
        assert int(batch.completion_mask.sum()) == int(sampled.sum())
        reference = np.asarray(
            trainer_logps(
                trainer, rollout, jnp.asarray(batch.prompt_ids), jnp.asarray(batch.completion_ids)
            )[0]
        )
        mask = batch.completion_mask.astype(bool)
        np.testing.assert_allclose(batch.rollout_logprobs[mask], reference[mask], atol=1e-4)
    finally:
        rollout.shutdown()
