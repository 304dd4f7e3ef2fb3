"""How a block of queries' scores over a request's keys, read chunk by chunk, become its
attention output: the softmax variants of `paged_attention`.

Owns `online_softmax` (one pass, a running max and sum; with rounded weights a second pass)
and `softmax_in_dtype` (three passes: the softmax computed in a narrow dtype step by step, as
`jax.nn.softmax` on scores of that dtype computes it), each over `Keys`: `chunk_scores(i)`,
chunk i's scores `[blocks, kv, group, size, chunk]` in the statistics dtype (unseen keys at its
min), which keys each query sees and the chunk's values `[blocks, chunk, kv, head_dim]`, and
`loop`, the chunks to read. Nothing here imports sgl-jax or this project.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

Out = Float[Array, "blocks kv group size head_dim"]


@dataclasses.dataclass(frozen=True)
class Keys:
    """A block of queries' keys, as both softmaxes read them: `chunk_scores(i)` (see the module
    docstring), `loop` (first and end chunk), the output's `shape` `[blocks, kv, group, size]`
    and `head_dim`, the statistics dtype `stat`, and the attention sink per head or None."""

    chunk_scores: Callable[[Any], tuple[Any, Any, Any]]
    loop: tuple[Any, Any]
    shape: tuple[int, int, int, int]
    head_dim: int
    stat: Any
    sink: Float[Array, " heads"] | None


def online_softmax(keys: Keys, options: Any) -> Out:
    """The attention `[blocks, kv, group, size, head_dim]` in `stat` over `loop`'s chunks with
    an online softmax (running max and sum in `stat`), the sum divided once at the end; with
    `options.round_weights` (`ScoreOptions`), a second pass weighs the values by each
    normalised, rounded weight."""
    chunk_scores, loop, shape, stat = keys.chunk_scores, keys.loop, keys.shape, keys.stat

    def step(i, carry):
        top, total, acc = carry
        scores, seen, v = chunk_scores(i)
        new_top = jnp.maximum(top, jnp.max(scores, axis=-1, keepdims=True))
        exp = jnp.where(seen, jnp.exp(scores - new_top), 0.0)
        rescale = jnp.exp(top - new_top)
        total = total * rescale + jnp.sum(exp, -1, keepdims=True)
        if options.round_weights is not None:  # the values come in the second pass
            return new_top, total, acc
        weights = exp.astype(v.dtype) if options.softmax_dtype is not None else exp
        part = jnp.einsum("nkgbc,nckd->nkgbd", weights, v, preferred_element_type=stat)
        return new_top, total, acc * rescale + part

    top, total, acc = jax.lax.fori_loop(
        *loop,
        step,
        (
            jnp.full((*shape, 1), jnp.finfo(stat).min, stat),
            jnp.zeros((*shape, 1), stat),
            jnp.zeros((*shape, keys.head_dim), stat),
        ),
    )
    total = _with_sink(total, keys, top)
    total = jnp.where(total > 0, total, 1.0)
    if options.round_weights is None:
        return acc / total

    def weighted(i, acc):  # each weight normalised, then rounded, before the value product
        scores, seen, v = chunk_scores(i)
        weights = jnp.where(seen, jnp.exp(scores - top) / total, 0.0)
        weights = weights.astype(options.round_weights)
        return acc + jnp.einsum("nkgbc,nckd->nkgbd", weights, v, preferred_element_type=stat)

    return jax.lax.fori_loop(*loop, weighted, jnp.zeros((*shape, keys.head_dim), stat))


def _with_sink(total, keys: Keys, top):
    """The softmax's sum with the attention sink's `exp(sink - max)` per head, where one is."""
    if keys.sink is None:
        return total
    sink = keys.sink.reshape(1, keys.shape[1], keys.shape[2], 1, 1).astype(keys.stat)
    return total + jnp.exp(sink - top)


def softmax_in_dtype(keys: Keys, dtype: Any) -> Out:
    """`ScoreOptions.softmax_in`'s attention `[blocks, kv, group, size, head_dim]` in `stat`:
    `loop`'s chunks read three times, for the scores' max (every score already in `dtype`),
    the sum of the rounded `exp(score - max)` (in `stat`, then rounded), then the weights,
    each rounded after its division, times the values."""
    chunk_scores, loop, shape, stat = keys.chunk_scores, keys.loop, keys.shape, keys.stat

    def top_of(i, top):
        return jnp.maximum(top, jnp.max(chunk_scores(i)[0], axis=-1, keepdims=True))

    top = jax.lax.fori_loop(*loop, top_of, jnp.full((*shape, 1), jnp.finfo(stat).min, stat))

    def exps(i):
        scores, seen, v = chunk_scores(i)
        exp = jnp.exp((scores - top).astype(dtype))
        return jnp.where(seen, exp, jnp.zeros_like(exp)), v

    def sum_of(i, total):
        return total + jnp.sum(exps(i)[0].astype(stat), axis=-1, keepdims=True)

    total = jax.lax.fori_loop(*loop, sum_of, jnp.zeros((*shape, 1), stat))
    total = _with_sink(total, keys, top)
    total = jnp.where(total > 0, total, 1.0).astype(dtype)

    def weighted(i, acc):
        exp, v = exps(i)
        return acc + jnp.einsum("nkgbc,nckd->nkgbd", exp / total, v, preferred_element_type=stat)

    return jax.lax.fori_loop(*loop, weighted, jnp.zeros((*shape, keys.head_dim), stat))
