"""A managed three-turn chat on the built-in model (engine-marked).

It starts its own engine (one engine per process), after tests/test_rollout.py has shut the
session rollout down.
"""

import numpy as np
import pytest

pytestmark = pytest.mark.engine


def test_three_turn_chat_stays_aligned_with_prefill_scoring(tiny_dir):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.session import MASK_ID
    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from tests.conftest import TEST_SETTINGS

    if patches._active is not None:
        pytest.skip("another engine is still running in this process")
    rollout = SglangJaxRollout(model_path=tiny_dir, engine_settings=TEST_SETTINGS)
    # temperature 1, no truncation: processed logprobs are the model's own log-softmax
    config = RolloutConfig(max_tokens_to_generate=12, temperature=1.0, top_p=1.0, seed=3)
    try:
        messages = [{"role": "user", "content": "what is the weather"}]
        with rollout.session(track_tree=True, rollout_config=config) as s:
            for turn in range(3):
                (node,) = s.chat(messages)
                a, b = node.metadata["turns"][-1]
                reply = s._tokenizer.decode(node.tokens[a:b], skip_special_tokens=True)
                messages = messages + [
                    {"role": "assistant", "content": reply},
                    {"role": "tool", "content": f"result {turn}"},
                ]
            nodes = s.state()
        assert len(nodes) == 3  # tree mode: one node per turn, each the parent of the next
        for n in nodes.values():
            assert len(n.tokens) == len(n.masked_tokens) == len(n.logprobs) == len(n.entropy)
        final = node
        assert len(final.metadata["turns"]) == 3
        # Every sampled logprob equals prefill scoring of the final sequence (same weights).
        start = final.metadata["turns"][0][0]
        (scored,) = rollout.engine.score([final.tokens[:start]], [final.tokens[start:]])
        sampled = np.array([m != MASK_ID for m in final.masked_tokens[start:]])
        np.testing.assert_allclose(
            np.asarray(final.logprobs[start:])[sampled], scored[sampled], atol=1e-4
        )
        assert np.all(
            np.asarray(final.logprobs)[~np.array([m != MASK_ID for m in final.masked_tokens])]
            == 1.0
        )
    finally:
        rollout.shutdown()
