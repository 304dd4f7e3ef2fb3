"""`paged_attention` against a float64 numpy reference of attention per request: requests laid
out as sgl-jax lays them (page-aligned runs of `cache_loc`, pages scattered over the pool),
page sizes 1 and 16, GQA, sliding windows, soft-caps, sinks, padding rows and tokens."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout.engine import paged_attention

HEADS, KV_HEADS, HEAD_DIM, DIM = 6, 2, 64, 128  # the pool pads head_dim to 128


def _pool(rng, page_size, seq_lens):
    """A fused buffer of random K / V, and `cache_loc` for requests of `seq_lens` on
    scattered pages, laid out as `ScheduleBatch._merge_cache_loc` lays them."""
    pages = sum(-(-n // page_size) for n in seq_lens) + 8
    fused = rng.normal(size=(pages, page_size, 2 * KV_HEADS, 1, DIM)).astype(np.float32)
    free = list(rng.permutation(np.arange(1, pages)))  # page 0 is the pool's padding page
    cache_loc, runs = [], []
    for n in seq_lens:
        own = [free.pop() for _ in range(-(-n // page_size))]
        slots = [p * page_size + j for p in own for j in range(page_size)]
        runs.append(np.asarray(slots[:n], np.int64))
        cache_loc += slots
    cache_loc += [0] * 13  # the bucket's padding
    return fused, np.asarray(cache_loc, np.int32), runs


def _kv(fused, slots):
    flat = fused.reshape(-1, 2 * KV_HEADS, DIM).astype(np.float64)
    return flat[slots, 0::2, :HEAD_DIM], flat[slots, 1::2, :HEAD_DIM]


def _reference(q, k, v, scale, cap, sink, allowed):
    """One query `[heads, head_dim]` over keys `[keys, kv_heads, head_dim]`, `allowed` a
    boolean per key."""
    group = HEADS // KV_HEADS
    out = np.zeros((HEADS, HEAD_DIM))
    for h in range(HEADS):
        s = k[:, h // group] @ q[h] * scale
        if cap:
            s = cap * np.tanh(s / cap)
        s = np.where(allowed, s, -np.inf)
        top = s.max()
        e = np.exp(s - top)
        total = e.sum() + (np.exp(sink[h] - top) if sink is not None else 0.0)
        out[h] = (e / total) @ v[:, h // group]
    return out


def _options(scale, case):
    return paged_attention.ScoreOptions(scale=scale, logit_cap=case["cap"], window=case["window"])


CASES = [
    dict(page_size=1, cap=None, window=None, sink=False, causal=True, chunk=128),
    dict(page_size=16, cap=None, window=None, sink=False, causal=True, chunk=8),
    dict(page_size=16, cap=30.0, window=9, sink=True, causal=True, chunk=16),
    dict(page_size=4, cap=None, window=20, sink=False, causal=False, chunk=8),  # decode: causal
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_decode_reads_each_rows_own_slots(case):
    rng = np.random.default_rng(case["page_size"])
    seq_lens = [5, 37, 16, 1]
    fused, cache_loc, runs = _pool(rng, case["page_size"], seq_lens)
    rows = 6  # two padding rows past the requests, one padding request
    lens = np.asarray(seq_lens + [0], np.int32)
    q = rng.normal(size=(rows, HEADS, HEAD_DIM)).astype(np.float32)
    sink = rng.normal(size=HEADS).astype(np.float32) if case["sink"] else None
    scale = 0.125
    out = paged_attention.decode_attention(
        jnp.asarray(q),
        jnp.asarray(fused),
        jnp.asarray(cache_loc),
        jnp.asarray(lens),
        page_size=case["page_size"],
        chunk=case["chunk"],
        options=_options(scale, case),
        sink=None if sink is None else jnp.asarray(sink),
    )
    out = np.asarray(out)
    for r, slots in enumerate(runs):
        k, v = _kv(fused, slots)
        pos = np.arange(len(slots))
        allowed = pos >= len(slots) - case["window"] if case["window"] else pos >= 0
        want = _reference(q[r].astype(np.float64), k, v, scale, case["cap"], sink, allowed)
        np.testing.assert_allclose(out[r], want, rtol=2e-5, atol=2e-5, err_msg=f"row {r}")
    np.testing.assert_array_equal(out[len(seq_lens) :], 0)  # the padding request and rows


# Each request's new tokens: a few blocks of queries (one group, `BLOCK_GROUP`), or many
# (several groups, each looping over its own keys: a request's early blocks stop early).
EXTENDS = {"short": [5, 7, 16], "long": [70, 7, 41]}


@pytest.mark.parametrize("extend", EXTENDS.values(), ids=EXTENDS.keys())
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_extend_writes_then_attends_causally_to_its_own_request(case, extend):
    rng = np.random.default_rng(10 + case["page_size"])
    prefix = [0, 30, 3]
    seq_lens = [p + e for p, e in zip(prefix, extend, strict=True)]
    fused, cache_loc, runs = _pool(rng, case["page_size"], seq_lens)
    tokens = sum(extend) + 4  # the token bucket's padding
    new_k = rng.normal(size=(tokens, KV_HEADS, HEAD_DIM)).astype(np.float32)
    new_v = rng.normal(size=(tokens, KV_HEADS, HEAD_DIM)).astype(np.float32)
    out_loc = np.concatenate(
        [slots[p:] for slots, p in zip(runs, prefix, strict=True)] + [np.full(4, -1)]
    ).astype(np.int32)
    new = np.zeros((tokens, 2 * KV_HEADS, DIM), np.float32)
    new[:, 0::2, :HEAD_DIM], new[:, 1::2, :HEAD_DIM] = new_k, new_v
    written = paged_attention.write_kv(jnp.asarray(fused), jnp.asarray(out_loc), jnp.asarray(new))
    q = rng.normal(size=(tokens, HEADS, HEAD_DIM)).astype(np.float32)
    sink = rng.normal(size=HEADS).astype(np.float32) if case["sink"] else None
    scale = 0.125
    out = paged_attention.extend_attention(
        jnp.asarray(q),
        written,
        jnp.asarray(cache_loc),
        jnp.asarray(np.asarray(seq_lens + [0], np.int32)),  # and a padding request
        jnp.asarray(np.asarray(prefix + [0], np.int32)),
        jnp.asarray(np.asarray(extend + [0], np.int32)),
        page_size=case["page_size"],
        chunk=case["chunk"],
        options=_options(scale, case),
        causal=case["causal"],
        sink=None if sink is None else jnp.asarray(sink),
    )
    out = np.asarray(out)
    expected_buffer = fused.reshape(-1, 2 * KV_HEADS, DIM).copy()
    expected_buffer[out_loc[out_loc >= 0]] = new[out_loc >= 0]
    np.testing.assert_array_equal(
        np.asarray(written).reshape(expected_buffer.shape), expected_buffer
    )
    t = 0
    for r, slots in enumerate(runs):
        k, v = _kv(expected_buffer.reshape(fused.shape), slots)
        for i in range(extend[r]):
            pos = prefix[r] + i
            keys = np.arange(len(slots))
            allowed = keys <= pos if case["causal"] else keys >= 0
            if case["window"]:
                allowed &= pos - keys < case["window"]
            want = _reference(q[t].astype(np.float64), k, v, scale, case["cap"], sink, allowed)
            np.testing.assert_allclose(out[t], want, rtol=2e-5, atol=2e-5, err_msg=f"{r}/{i}")
            t += 1
    np.testing.assert_array_equal(out[t:], 0)


def test_request_offsets_round_each_request_up_to_whole_pages():
    offsets = paged_attention.request_offsets(jnp.asarray([5, 16, 17, 0, 3]), 16)
    np.testing.assert_array_equal(np.asarray(offsets), [0, 16, 32, 64, 64])


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_a_layers_write_and_read_copy_no_whole_buffer(mode):
    """The KV write is a scatter XLA does in place on the donated buffer, and the read gathers
    only the slots it needs: the compiled step's temporaries stay far below one layer's cache
    (upstream's write through a flattened view copied the whole buffer every layer and step)."""
    import jax

    page_size, pages, rows = 16, 2048, 8
    fused = jnp.zeros((pages, page_size, 2 * KV_HEADS, 1, DIM), jnp.float32)
    q = jnp.zeros((rows, HEADS, HEAD_DIM), jnp.float32)
    cache_loc = jnp.arange(rows * 64, dtype=jnp.int32)
    lens = jnp.full((rows,), 64, jnp.int32)
    new = jnp.zeros((rows, 2 * KV_HEADS, DIM), jnp.float32)

    def step(fused, q, out_loc, new):
        fused = paged_attention.write_kv(fused, out_loc, new)
        common = dict(page_size=page_size, options=paged_attention.ScoreOptions(scale=0.125))
        if mode == "decode":
            out = paged_attention.decode_attention(q, fused, cache_loc, lens, **common)
        else:
            ones = jnp.ones_like(lens)
            out = paged_attention.extend_attention(
                q, fused, cache_loc, lens, lens - 1, ones, **common
            )
        return out, fused

    out_loc = jnp.arange(rows, dtype=jnp.int32) * 64
    compiled = jax.jit(step, donate_argnums=0).lower(fused, q, out_loc, new).compile()
    memory = compiled.memory_analysis()
    assert memory.alias_size_in_bytes == fused.nbytes  # the buffer comes back in place
    assert memory.temp_size_in_bytes < fused.nbytes / 4, memory.temp_size_in_bytes


def _tunix_attention(q, k, v, scale):
    """tunix's Qwen3 / Llama attention of one query `[heads, head_dim]` over keys `[keys,
    kv_heads, head_dim]`, all bfloat16 (`models/qwen3/model.py` `Attention.__call__`): scores
    in bfloat16, softmax in float32, weights rounded to bfloat16 before the value product."""
    import jax

    grouped = q.reshape(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    scores = jnp.einsum("kgd,skd->kgs", grouped, k) * scale
    weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(jnp.bfloat16)
    return jnp.einsum("kgs,skd->kgd", weights, v).reshape(HEADS, HEAD_DIM)


def test_rounded_weights_round_as_tunix_does_in_bfloat16():
    """`round_weights` (numerics="trainer"): a bfloat16 decode step's outputs are tunix's
    almost everywhere; upstream's unrounded weights give another bfloat16 output in many
    elements."""
    rng = np.random.default_rng(3)
    seq_lens = [300, 77, 129]
    fused, cache_loc, runs = _pool(rng, 16, seq_lens)
    q = rng.normal(size=(len(seq_lens), HEADS, HEAD_DIM))
    bf16 = jnp.bfloat16
    args = (jnp.asarray(q, bf16), jnp.asarray(fused, bf16), jnp.asarray(cache_loc))
    lens = jnp.asarray(np.asarray(seq_lens, np.int32))
    outs = {
        rounded: np.asarray(
            paged_attention.decode_attention(
                *args,
                lens,
                page_size=16,
                options=paged_attention.ScoreOptions(scale=0.125, round_weights=rounded),
            ).astype(jnp.float32)
        )
        for rounded in (bf16, None)
    }
    tunix = []
    for r, slots in enumerate(runs):
        k, v = (jnp.asarray(x, bf16) for x in _kv(np.asarray(fused, np.float32), slots))
        tunix.append(np.asarray(_tunix_attention(args[0][r], k, v, 0.125).astype(jnp.float32)))
    tunix = np.stack(tunix)
    same = {rounded: float(np.mean(out == tunix)) for rounded, out in outs.items()}
    assert same[bf16] >= 0.99, same
    assert same[None] <= 0.95, same
    step = np.abs(tunix) * 2.0**-7 + 1e-30  # one bfloat16 step at most
    assert np.all(np.abs(outs[bf16] - tunix) <= step)


def _tunix_gemma_attention(q, k, v, scale):
    """tunix's Gemma 3 attention of one query `[heads, head_dim]` over keys `[keys, kv_heads,
    head_dim]`, all bfloat16 (`models/gemma3/model.py` `Attention.__call__`): scores in
    bfloat16, then `jax.nn.softmax` on them, in bfloat16 throughout."""
    import jax

    grouped = q.reshape(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    scores = jnp.einsum("kgd,skd->kgs", grouped * jnp.bfloat16(scale), k)
    weights = jax.nn.softmax(scores, axis=-1).astype(jnp.bfloat16)
    return jnp.einsum("kgs,skd->kgd", weights, v).reshape(HEADS, HEAD_DIM)


def test_softmax_in_dtype_computes_as_tunix_gemma_does_in_bfloat16():
    """`softmax_in` (numerics="trainer" on Gemma 2 / 3): a bfloat16 decode step's outputs are
    tunix's Gemma attention's almost everywhere, over requests of several key chunks; the
    float32 softmax with rounded weights (Qwen's rounding) gives another output in many
    elements. (A power-of-two scale, as Gemma 2 2B's and Gemma 3 1B's 256 ** -0.5, is exact
    before or after the product. Gemma 2's soft cap agrees as well only with XLA's excess
    precision off: compiled, XLA keeps its `tanh(s / cap) * cap` in float32, where tunix's
    eager ops round each step; checked by hand, not here.)"""
    rng = np.random.default_rng(5)
    seq_lens = [300, 77, 129]
    fused, cache_loc, runs = _pool(rng, 16, seq_lens)
    q = rng.normal(size=(len(seq_lens), HEADS, HEAD_DIM)) * 4.0  # peaked weights
    bf16 = jnp.bfloat16
    args = (jnp.asarray(q, bf16), jnp.asarray(fused, bf16), jnp.asarray(cache_loc))
    lens = jnp.asarray(np.asarray(seq_lens, np.int32))
    options = {
        "softmax_in": paged_attention.ScoreOptions(scale=0.125, softmax_in=bf16),
        "rounded": paged_attention.ScoreOptions(scale=0.125, round_weights=bf16),
    }
    outs = {
        name: np.asarray(
            paged_attention.decode_attention(*args, lens, page_size=16, options=option).astype(
                jnp.float32
            )
        )
        for name, option in options.items()
    }
    tunix = []
    for r, slots in enumerate(runs):
        k, v = (jnp.asarray(x, bf16) for x in _kv(np.asarray(fused, np.float32), slots))
        out = _tunix_gemma_attention(args[0][r], k, v, 0.125)
        tunix.append(np.asarray(out.astype(jnp.float32)))
    tunix = np.stack(tunix)
    same = {name: float(np.mean(out == tunix)) for name, out in outs.items()}
    assert same["softmax_in"] >= 0.99, same
    assert same["rounded"] <= 0.9, same
    step = np.abs(tunix) * 2.0**-7 + 1e-30  # one bfloat16 step at most
    assert np.all(np.abs(outs["softmax_in"] - tunix) <= step)
