"""`attention_head_dim_unpadded` (`patches/upstream_fixes.py`): sgl-jax's CPU attention on a KV
pool padded from head_dim 64 to 128, as the engine lays it out, against float64 attention on
the unpadded heads. Calls upstream's `forward_attention` (through the patched module) directly;
no engine starts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.engine  # needs sgl-jax importable (no engine is started)

HEADS, KV_HEADS, HEAD_DIM, TOKENS = 4, 2, 64, 7


def _reference(q, k, v) -> np.ndarray:
    """Causal GQA attention in float64: [tokens, heads * head_dim]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k = np.repeat(k, HEADS // KV_HEADS, axis=1)
    v = np.repeat(v, HEADS // KV_HEADS, axis=1)
    logits = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM)
    logits = np.where(np.tril(np.ones((TOKENS, TOKENS), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", weights, v).reshape(TOKENS, -1)


@pytest.mark.parametrize("q_layout", ["heads", "flat"])
def test_attention_head_dim_unpadded_matches_unpadded_attention(q_layout):
    from sgl_jax_rollout.engine import patches, upstream

    patches.apply()
    forward_attention = upstream.module("layers.attention.native_backend").forward_attention
    mode = upstream.get("ForwardMode").EXTEND
    rng = np.random.default_rng(0)
    q = rng.standard_normal((TOKENS, HEADS, HEAD_DIM)).astype(np.float32)
    k = rng.standard_normal((TOKENS, KV_HEADS, HEAD_DIM)).astype(np.float32)
    v = rng.standard_normal((TOKENS, KV_HEADS, HEAD_DIM)).astype(np.float32)
    # The pool's layout: head_dim padded with zeros to 128, slot 0 unused (loc 0 is padding).
    pad = ((1, 0), (0, 0), (0, 128 - HEAD_DIM))
    k_cache, v_cache = (jnp.asarray(np.pad(x, pad)) for x in (k, v))
    mesh = jax.make_mesh(
        (1, 1), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
    )
    with jax.set_mesh(mesh):
        out = forward_attention(
            jnp.asarray(q if q_layout == "heads" else q.reshape(TOKENS, -1)),
            k_cache,
            v_cache,
            jnp.asarray([TOKENS], jnp.int32),
            jnp.arange(1, TOKENS + 1, dtype=jnp.int32),
            jnp.asarray([0], jnp.int32),
            jnp.asarray([TOKENS], jnp.int32),
            HEADS,
            KV_HEADS,
            scale=HEAD_DIM**-0.5,
            is_causal=True,
            mode=mode,
            mesh=mesh,
        )
    assert out.shape == (TOKENS, HEADS * HEAD_DIM)  # upstream: HEADS * 128
    np.testing.assert_allclose(np.asarray(out), _reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_unpadded_heads_leaves_widths_that_are_no_pool_padding():
    from sgl_jax_rollout.engine.patches.upstream_fixes import unpadded_heads

    out = jnp.arange(2 * 3 * 128, dtype=jnp.float32).reshape(2, 3 * 128)
    cut = unpadded_heads(out, head_dim=96, num_heads=3)
    np.testing.assert_array_equal(cut, np.asarray(out).reshape(2, 3, 128)[..., :96].reshape(2, -1))
    assert unpadded_heads(out, head_dim=128, num_heads=3) is out  # no padding
    narrow_v = jnp.zeros((2, 3 * 128))
    assert unpadded_heads(narrow_v, head_dim=192, num_heads=3) is narrow_v  # V narrower than q


def test_attention_logit_cap_soft_caps_the_scores():
    """`attention_logit_cap`: while a capped layer is traced, upstream's CPU attention takes
    `cap * tanh(scores / cap)` (Gemma 2's `attn_logit_softcapping`), against float64; other
    layers' attention is unchanged."""
    from sgl_jax_rollout.engine import patches, upstream
    from sgl_jax_rollout.engine.patches import upstream_fixes

    patches.apply()
    forward_attention = upstream.module("layers.attention.native_backend").forward_attention
    mode = upstream.get("ForwardMode").EXTEND
    rng = np.random.default_rng(2)
    heads, kv_heads, head_dim, tokens, cap = 2, 1, 128, 9, 3.0
    q = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32) * 4
    k = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32) * 4
    v = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    scale = head_dim**-0.5

    def reference(capped: bool) -> np.ndarray:
        k_rep = np.repeat(k.astype(np.float64), heads // kv_heads, axis=1)
        v_rep = np.repeat(v.astype(np.float64), heads // kv_heads, axis=1)
        scores = np.einsum("qhd,khd->hqk", q.astype(np.float64), k_rep) * scale
        if capped:
            scores = cap * np.tanh(scores / cap)
        scores = np.where(np.tril(np.ones((tokens, tokens), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        return np.einsum("hqk,khd->qhd", weights, v_rep).reshape(tokens, -1)

    mesh = jax.make_mesh(
        (1, 1), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
    )
    pad = ((1, 0), (0, 0), (0, 0))
    k_cache, v_cache = (jnp.asarray(np.pad(x, pad)) for x in (k, v))

    def attend():
        with jax.set_mesh(mesh):
            return np.asarray(
                forward_attention(
                    jnp.asarray(q),
                    k_cache,
                    v_cache,
                    jnp.asarray([tokens], jnp.int32),
                    jnp.arange(1, tokens + 1, dtype=jnp.int32),
                    jnp.asarray([0], jnp.int32),
                    jnp.asarray([tokens], jnp.int32),
                    heads,
                    kv_heads,
                    scale=scale,
                    is_causal=True,
                    mode=mode,
                    mesh=mesh,
                )
            )

    token = upstream_fixes._SCORE_CAP.set((cap, scale))
    try:
        capped = attend()
    finally:
        upstream_fixes._SCORE_CAP.reset(token)
    np.testing.assert_allclose(capped, reference(True), rtol=1e-5, atol=1e-5)
    assert np.abs(reference(True) - reference(False)).max() > 0.1  # the cap bites here
    np.testing.assert_allclose(attend(), reference(False), rtol=1e-5, atol=1e-5)
