"""`grouped_matmul` against a float64 numpy reference: rows sorted by group, groups of every
size (empty ones, ones spanning several tiles, one row), a row count that is no multiple of
the tile, this shard holding all the groups or some (expert parallel: the other rows zero),
bfloat16 in and out; and against upstream's megablox `gmm` (run interpreted, as off TPU),
with the `experts_matmul_off_tpu` patch choosing between them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout.engine.grouped_matmul import TILE_ROWS, grouped_matmul

K, N = 16, 24


def _case(rows: int, groups: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(rows, rng.dirichlet(np.ones(groups) * 0.5)).astype(np.int32)
    sizes[1] = 0  # an empty group
    sizes[0] += rows - sizes.sum()
    lhs = rng.normal(size=(rows, K)).astype(np.float32)
    rhs = rng.normal(size=(groups, K, N)).astype(np.float32)
    return lhs, rhs, sizes


def _reference(lhs, rhs, sizes, offset, local):
    out = np.zeros((len(lhs), N))
    ends = np.cumsum(sizes)
    for g in range(offset, offset + local):
        rows = slice(ends[g] - sizes[g], ends[g])
        out[rows] = lhs[rows].astype(np.float64) @ rhs[g].astype(np.float64)
    return out


@pytest.mark.parametrize("rows", [3, 3 * TILE_ROWS + 37])
@pytest.mark.parametrize("offset, local", [(0, 8), (5, 3)])
def test_each_row_is_its_groups_product_and_other_shards_rows_are_zero(rows, offset, local):
    import jax

    lhs, rhs, sizes = _case(rows, 8, seed=rows)
    out = jax.jit(grouped_matmul, static_argnums=4)(
        jnp.asarray(lhs),
        jnp.asarray(rhs[offset : offset + local]),
        jnp.asarray(sizes),
        jnp.asarray(offset, jnp.int32),
        jnp.float32,
    )
    assert out.shape == (rows, N) and out.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(out), _reference(lhs, rhs, sizes, offset, local), rtol=1e-5, atol=1e-5
    )


def test_bfloat16_in_and_out_accumulates_in_float32():
    import jax

    lhs, rhs, sizes = _case(300, 8)
    bf16 = [jnp.asarray(a, jnp.bfloat16) for a in (lhs, rhs)]
    matmul = jax.jit(grouped_matmul, static_argnums=4)
    out = matmul(*bf16, jnp.asarray(sizes), jnp.asarray(0, jnp.int32), jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    rounded = [np.asarray(a.astype(jnp.float32)) for a in bf16]
    want = _reference(*rounded, sizes, 0, 8)
    # one bfloat16 rounding of a float32 sum (2^-8 relative), not K of them
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2**-8, atol=1e-2)


@pytest.mark.engine
def test_the_patch_serves_upstreams_gmm_product_and_leaves_scaled_experts_to_upstream():
    """Upstream's gmm, interpreted, on rows a multiple of its 128-row tile, equals
    `grouped_matmul` (float32 rounding apart); the patch sends a call with `rhs_scale` to the
    function it wraps (here a recording stand-in for it, so the test is about the patch)."""
    import jax

    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.patches.upstream_fixes import _experts_matmul_off_tpu

    gmm = getattr(upstream.get("gmm"), "__wrapped__", upstream.get("gmm"))
    lhs, rhs, sizes = _case(2 * TILE_ROWS, 8)
    args = dict(lhs=jnp.asarray(lhs), rhs=jnp.asarray(rhs), group_sizes=jnp.asarray(sizes))
    common = dict(preferred_element_type=jnp.float32, group_offset=jnp.asarray(0, jnp.int32))
    theirs = jax.jit(lambda a: gmm(**a, **common, maybe_quantize_lhs=False))(args)
    ours = jax.jit(lambda a: _experts_matmul_off_tpu(gmm, **a, **common, interpret=True))(args)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-5)

    calls = []
    stand_in = lambda *a, **k: calls.append(k) or "upstream's"  # noqa: E731
    scale = jnp.ones((8, 1, 1, N))
    assert _experts_matmul_off_tpu(stand_in, **args, **common, rhs_scale=scale) == "upstream's"
    assert _experts_matmul_off_tpu(stand_in, **args, **common, interpret=False) == "upstream's"
    assert len(calls) == 2
