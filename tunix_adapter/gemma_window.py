"""Gemma's sliding window on the trainer side, measured in token positions.

Owns `fix_sliding_window`. tunix's Gemma (0.1.7 `tunix/models/gemma/model.py:311-337`,
unchanged on main at c7d8950f) builds the local layers' mask by comparing the query's token
position with the key's *index* in the sequence (`cache_positions = jnp.arange(cache_len)`).
The RL trainer left-pads prompts, so a key's index is its position plus the row's padding: the
window of a padded row reaches `padding` tokens further back than the checkpoint's (HF and
the engine: key allowed when `query_pos - key_pos < window`). Measured on a tiny Gemma 2
replica with a 256-token window and prompts of ~790 tokens in a batch padded to 1,200: up to
1.06 nats between the engine's logprobs and the trainer's; 5e-7 with the window out of reach.

Without a cache (the trainer's forward: the keys are the query tokens themselves) the fix
compares the keys' token positions, which are the same `segment_pos`; with a cache (tunix's
own sampler) it leaves tunix's mask as it is.
"""

from __future__ import annotations

import functools

from jaxtyping import Array, Bool, Int

from sgl_jax_rollout import tunix_compat

_MARK = "_sgl_jax_rollout_fix"


def fix_sliding_window() -> None:
    """Idempotent: tunix's Gemma masks its local layers by token positions."""
    model_lib = tunix_compat.model_module("gemma", "model")
    original = getattr(model_lib, "_create_sliding_mask", None)
    if original is None:
        raise RuntimeError(
            "tunix.models.gemma.model no longer has _create_sliding_mask: review "
            "tunix_adapter.gemma_window against this tunix release"
        )
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def sliding_mask(segment_pos, cache_len: int, sliding_window_size: int):
        if cache_len != segment_pos.shape[1]:
            return original(segment_pos, cache_len, sliding_window_size)
        return positional_window(segment_pos, sliding_window_size)

    setattr(sliding_mask, _MARK, True)
    model_lib._create_sliding_mask = sliding_mask


def positional_window(positions: Int[Array, "b t"], window: int) -> Bool[Array, "b t t"]:
    """Key j visible from query i when their token positions differ by less than `window`
    (either way, as tunix's mask; causality is the attention mask's)."""
    distance = positions[:, :, None] - positions[:, None, :]
    return (distance < window) & (distance > -window)
