"""tunix's Gemma local layers with left-padded prompts (`tunix_adapter.gemma_window`): the
trainer's logprobs of a completion must not depend on how much padding its prompt row carries,
as they do not in HF or the engine (the window counts token positions). Tiny Gemma 2 replica,
window 256, prompt of 400 tokens: the window is crossed."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("gemma") / "g2", like="gemma-2-2b-it")


def _logps(model, prompt_rows, completion):
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout import tunix_compat

    graphdef, state = nnx.split(model)
    logps, _ = tunix_compat.per_token_logps_and_logits(
        graphdef,
        state,
        jnp.asarray(prompt_rows),
        jnp.asarray(np.repeat(completion[None], len(prompt_rows), 0)),
        0,  # <pad>
        1,  # <eos>
        1.0,
    )
    return np.asarray(logps, np.float64)


def test_left_padding_does_not_move_the_window(gemma_dir):
    from tunix_adapter.gemma_window import positional_window
    from tunix_adapter.models import load_tunix_model

    model = load_tunix_model(gemma_dir)  # applies the fix
    rng = np.random.default_rng(0)
    prompt = np.concatenate([[2], rng.integers(108, 1024, 399)])  # <bos> and 399 tokens
    completion = rng.integers(108, 1024, 12)
    unpadded = _logps(model, prompt[None], completion)[0]
    for padding in (100, 700):
        padded = _logps(model, np.pad(prompt, (padding, 0))[None], completion)[0]
        np.testing.assert_allclose(padded, unpadded, atol=2e-5, rtol=0)
    # the mask itself: token distance below the window, either way
    positions = np.asarray([[0, 0, 0, 1, 2, 3]])  # three pads (position 0), then tokens
    mask = np.asarray(positional_window(positions, 2))
    assert mask[0, 5].tolist() == [False, False, False, False, True, True]
