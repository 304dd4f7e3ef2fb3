"""`check_weights.perturbed`: noise of `scale` times each leaf's standard deviation (`scale` for
a constant leaf), seeded; the same noise from its one-process path (a program per leaf shape)
and its across-processes path (one program over every leaf), and no new program for another
seed or scale."""

from __future__ import annotations

import numpy as np


def _state():
    rng = np.random.default_rng(0)
    return {
        "embed": rng.normal(0.0, 3.0, (400, 64)).astype(np.float32),
        "layers": [
            {
                "w": rng.normal(0.0, 0.1, (64, 128)).astype(np.float32),
                "norm": np.ones(64, np.float32),
            }
            for _ in range(3)
        ],
    }


def test_noise_is_scale_times_each_leafs_spread_and_seeded():
    import jax

    from tunix_adapter.check_weights import perturbed

    state = jax.tree_util.tree_map(jax.numpy.asarray, _state())
    out = perturbed(state, scale=0.05, seed=1)
    for x, y in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(out), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        spread = x.std() if x.std() > 0 else 1.0
        np.testing.assert_allclose((y - x).std(), 0.05 * spread, rtol=0.3 if x.size < 100 else 0.05)
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]
    again = [np.asarray(x) for x in jax.tree_util.tree_leaves(perturbed(state, 0.05, 1))]
    other = [np.asarray(x) for x in jax.tree_util.tree_leaves(perturbed(state, 0.05, 2))]
    assert all(np.array_equal(a, b) for a, b in zip(leaves, again, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(leaves, other, strict=True))
    # the layers' equal norms (leaves 1, 3, 5: one shape, one program) got noise of their own
    assert not np.array_equal(leaves[1], leaves[3]) and not np.array_equal(leaves[3], leaves[5])


def test_one_process_and_across_processes_give_the_same_noise_from_programs_per_shape():
    import jax

    from tunix_adapter import check_weights

    state = jax.tree_util.tree_map(jax.numpy.asarray, _state())
    leaves = jax.tree_util.tree_leaves(state)
    per_leaf, whole = check_weights._programs()
    one_process = jax.tree_util.tree_leaves(check_weights.perturbed(state, 0.05, 3))
    across = whole(leaves, 0.05, 3)
    for a, b in zip(one_process, across, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    compiled = per_leaf._cache_size()
    check_weights.perturbed(state, 0.2, 4)
    assert per_leaf._cache_size() == compiled  # another seed and scale: the same programs
    assert compiled <= len({(x.shape, x.dtype) for x in leaves})
