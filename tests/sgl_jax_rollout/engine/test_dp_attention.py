"""`dp_attention.rank_kv_update` writes and reads the KV cache exactly as sgl-jax's native
backend does (`NativeAttention._get_and_update_kv_cache` over `set_kv_buffer_legacy`): a
change of upstream's fused layout fails here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.dp_attention import rank_kv_update

pytestmark = pytest.mark.engine


class _Batch:  # the one field `_get_and_update_kv_cache` reads of a ForwardBatch
    def __init__(self, out_cache_loc):
        self.out_cache_loc = out_cache_loc


class _Backend:  # the one field it reads of the backend (test double: our code is under test)
    def __init__(self, mesh):
        self.kv_sharding = NamedSharding(mesh, P(None, "tensor", None))


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_rank_kv_update_matches_upstream_write_and_split(kv_heads):
    mesh = Mesh(
        np.asarray(jax.devices()[:1]).reshape(1, 1),
        ("data", "tensor"),
        axis_types=(AxisType.Explicit,) * 2,
    )
    rng = np.random.default_rng(kv_heads)
    head_dim, slots = 128, 16  # upstream aligns head_dim to 128 in merge_kv
    with jax.set_mesh(mesh):
        pool = upstream.get("MHATokenToKVPool")(
            size=slots,
            page_size=1,
            dtype=jnp.float32,
            head_num=kv_heads,
            head_dim=head_dim,
            layer_num=1,
            mesh=mesh,
        )
        before = rng.normal(size=pool.get_fused_kv_buffer(0).shape).astype(np.float32)
        pool.kv_buffer[0] = jax.device_put(before, pool.kv_buffer[0].sharding)
        k, v = (jnp.asarray(rng.normal(size=(4, kv_heads, head_dim)), jnp.float32) for _ in "kv")
        loc = jnp.asarray([3, -1, 7, 0], jnp.int32)  # -1: a padding token, not written
        theirs = upstream.get("NativeAttention")._get_and_update_kv_cache(
            _Backend(mesh), k, v, _Batch(loc), pool, 0
        )
        ours = rank_kv_update(jnp.asarray(before), loc, k, v)
    for name, a, b in zip(("k", "v", "fused"), theirs, ours, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    np.testing.assert_array_equal(np.asarray(ours[0])[7], np.asarray(k)[2])
    np.testing.assert_array_equal(np.asarray(ours[1])[0], np.asarray(v)[3])
