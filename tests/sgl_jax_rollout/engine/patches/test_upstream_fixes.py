"""`attention_head_dim_unpadded` (`patches/upstream_fixes.py`): sgl-jax's CPU attention on a KV
pool padded from head_dim 64 to 128, as the engine lays it out, against float64 attention on
the unpadded heads. Calls upstream's `forward_attention` (through the patched module) directly;
no engine starts."""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass
class _Batch:
    cache_loc: jax.Array


def _window_pool(mesh):
    """A hybrid pool as sgl-jax lays out Gemma 4's (model_runner_kv_cache_mixin.py:645-672):
    windowed layers 0 and 2 keep 2 KV heads of 128 in an 8-slot pool, full layer 1 keeps 1 KV
    head of 256 in a 16-slot pool; full slots 1..5 hold window slots 6, 2, 7, 1, 3."""
    from sgl_jax_rollout.engine import upstream

    pool = upstream.get("SWAKVPool")(
        size=16,
        size_swa=8,
        page_size=1,
        swa_attention_layer_ids=[0, 2],
        full_attention_layer_ids=[1],
        dtype=jnp.float32,
        head_num=1,
        head_dim=256,
        swa_head_num=2,
        swa_head_dim=128,
        mesh=mesh,
    )
    mapping = np.zeros(16 + 8 + 1, np.int32)
    mapping[1:6] = [6, 2, 7, 1, 3]
    pool.full_to_swa_index_mapping = mapping
    return pool, mapping


def test_swa_pool_native_attention_writes_and_reads_each_layer_in_its_own_pool():
    """swa_pool_native_attention: the native backend's KV write (`set_kv_buffer_legacy`, which
    upstream's `SWAKVPool` lacks) puts a windowed layer's keys and values at the window pool's
    slots and a full layer's at its own, padding (-1) dropped; the read (`swa_cache_loc`) gives
    the windowed layer the same window slots, and the full layer its slots unchanged. Checked
    against the sub-pools' own writes at slots mapped in numpy, through a jitted call as the
    model's forward runs it; and the pool's pytree children carry a copy of the host mapping
    (swa_mapping_copied)."""
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.engine.patches.upstream_fixes import swa_cache_loc

    patches.apply()
    mesh = jax.make_mesh(
        (1, 1), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
    )
    rng = np.random.default_rng(0)
    loc = np.asarray([1, 2, 3, 4, 5, -1], np.int32)
    with jax.set_mesh(mesh):
        pool, mapping = _window_pool(mesh)
        for layer, heads, dim in ((0, 2, 128), (1, 1, 256), (2, 2, 128)):
            k = jnp.asarray(rng.standard_normal((6, heads, dim)), jnp.float32)
            v = jnp.asarray(rng.standard_normal((6, heads, dim)), jnp.float32)
            written = jax.jit(pool.set_kv_buffer_legacy, static_argnums=0)(
                layer, jnp.asarray(loc), k, v
            )
            sub_layer, windowed = pool.layers_mapping[layer]
            sub = pool.swa_kv_pool if windowed else pool.full_kv_pool
            slots = np.where(loc < 0, -1, mapping[np.maximum(loc, 0)]) if windowed else loc
            expected = sub.set_kv_buffer_legacy(sub_layer, jnp.asarray(slots), k, v)
            np.testing.assert_array_equal(np.asarray(written), np.asarray(expected))
            # a stand-in for upstream's ForwardBatch dataclass: the read replaces one field
            read = swa_cache_loc(_Batch(jnp.asarray(loc)), pool, layer).cache_loc
            np.testing.assert_array_equal(np.asarray(read), slots)
        # swa_mapping_copied: what a forward receives is a copy of the host's mapping
        children, _ = pool.tree_flatten()
        (copy,) = [c for c in children if isinstance(c, np.ndarray)]
        assert copy is not mapping and np.array_equal(copy, mapping)


def test_cpu_memory_balance_sizes_by_the_minimum_without_the_balance_check(monkeypatch):
    """Two readings of the host's free RAM that differ by more than 10% (another process freed
    memory between them): upstream's check fails the start, the patched method returns the
    minimum upstream computed, and a non-CPU device still gets upstream's method."""
    import types

    import psutil

    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.patches import upstream_fixes

    readings = []

    def virtual_memory():  # 11 GB free, then 13 GB, then 11 GB, ...
        readings.append((11, 13)[len(readings) % 2] << 30)
        return types.SimpleNamespace(available=readings[-1])

    monkeypatch.setattr(psutil, "virtual_memory", virtual_memory)
    runner = types.SimpleNamespace(
        device="cpu", tp_size=4, server_args=types.SimpleNamespace(device_indexes=None)
    )
    method = upstream.get("ModelRunner").get_available_device_memory
    stock = getattr(method, "__wrapped__", method)  # upstream's, patched or not
    with pytest.raises(ValueError, match="unbalanced"):
        stock(runner)  # upstream: the first reading (11 GB) against 0.9 x the second (13 GB)

    readings.clear()
    assert upstream_fixes._host_memory_unchecked_on_cpu(stock, runner) == 11 << 30
    assert readings == [11 << 30]

    other = types.SimpleNamespace(device="tpu")
    assert upstream_fixes._host_memory_unchecked_on_cpu(lambda self: "stock", other) == "stock"
