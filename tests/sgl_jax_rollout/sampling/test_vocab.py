"""`Vocab` on one device: the blocked top-k is `lax.top_k` exactly, ties and masks included.
(The sharded reductions are tested against the unsharded sampler in test_vocab_parallel.py.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from sgl_jax_rollout.sampling.vocab import TOP_K_BLOCK, Vocab, blocked_top_k


def _rows(width: int) -> np.ndarray:
    rng = np.random.default_rng(width)
    rows = np.round(rng.normal(size=(6, width)) * 2.0, 1).astype(np.float32)  # many ties
    rows[1, :] = 0.0  # one value throughout
    rows[2, :] = -np.inf
    rows[2, [7, width - 1]] = [1.0, 2.0]  # fewer finite values than k
    rows[3, rng.choice(width, width // 2, replace=False)] = -np.inf
    rows[4, -3:] = 50.0  # the largest values in the last (padded) block
    return rows


@pytest.mark.parametrize("width", [TOP_K_BLOCK * 40, TOP_K_BLOCK * 40 + 37, 300])
@pytest.mark.parametrize("k", [1, 17, 65])
def test_blocked_top_k_is_lax_top_k(width, k):
    rows = jnp.asarray(_rows(width))
    want_values, want_ids = lax.top_k(rows, k)
    values, ids = blocked_top_k(rows, k)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(ids, want_ids)


def test_whole_vocab_take_and_top_k():
    rows = jnp.asarray(_rows(1000))
    vocab = Vocab(1000)
    ids = jnp.asarray([0, 999, 5, 500, 1, 2])
    np.testing.assert_array_equal(vocab.take(rows, ids), np.asarray(rows)[np.arange(6), ids])
    np.testing.assert_array_equal(vocab.top_k(rows, 9)[1], lax.top_k(rows, 9)[1])
