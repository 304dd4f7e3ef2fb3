"""Routing replay ("R3") for tunix's Qwen3-MoE trainer model: its MoE layers route each token
to the experts the rollout routed it to.

Owns `enable` (gives a model's MoE layers a replay slot), `replaying` (fills the slots for one
forward inside a traced function and empties them after), `routing_and_logps` (one jitted
trainer forward returning the completions' logprobs and the experts every layer chose, with or
without replay), `input_routing` (a rollout output's routing as the trainer's input
`[B, prompt + completion, layers, top_k]`), `mismatch_frac` (`rollout/routing_mismatch_frac`
per layer) and `own_routing_mismatch` (that share for a rollout output, as `check` reports it).

How (checked against google-tunix 0.1.7; main at c7d8950f has the same code): tunix's
`MoELayer.__call__` (`models/qwen3/model.py:735-741`) picks its experts with
`jax.lax.top_k(jax.nn.softmax(scores), k)` and renormalises the weights of the experts it
picked; on TPU the megablox path starts from the same call. While a layer's slot holds
experts, that `top_k` returns them with the router's probabilities of them (verl's R3: the
experts are replayed, their weights recomputed by the router, so its gradient flows), which
tunix then renormalises as for its own choice. Positions whose replayed row is -1 (padding,
a completion's last token, which the engine never takes as input) keep the trainer's own
choice; they carry no loss.

The replayed experts are state of the model (`RoutedExperts`, an nnx Variable that is not a
parameter: no gradient, not synced to the rollout), so they reach tunix's jitted functions as
arguments, never as values closed over by a trace.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from sgl_jax_rollout import tunix_compat

_MARK = "__sgl_jax_rollout_routing__"
# (experts of the layer being traced or None, the list its own choice is appended to or None)
_LAYER: contextvars.ContextVar[tuple[Any, list | None] | None] = contextvars.ContextVar(
    "sgl_jax_rollout_routing_layer", default=None
)
_CAPTURE: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "sgl_jax_rollout_routing_capture", default=None
)
_EMPTY = (0,)


class RoutedExperts(nnx.Variable):
    """A MoE layer's replayed experts `[B, T, top_k]` (shape `(0,)`: none, the layer routes)."""


def moe_layers(model: Any) -> list[Any]:
    """The tunix Qwen3 `MoELayer`s of `model`, in layer order (empty for a dense model)."""
    moe = tunix_compat.model_module("qwen3", "model").MoELayer
    return [layer.mlp for layer in getattr(model, "layers", []) if isinstance(layer.mlp, moe)]


def enable(model: Any) -> int:
    """Gives each MoE layer of `model` an empty replay slot and installs the replaying `top_k`
    (idempotent). Returns the number of MoE layers; ValueError for a model without any."""
    layers = moe_layers(model)
    if not layers:
        raise ValueError(
            "routing replay needs a tunix Qwen3 MoE model (num_experts set); this model has no "
            "MoE layer"
        )
    _install()
    for layer in layers:
        if not isinstance(getattr(layer, "routed_experts", None), RoutedExperts):
            layer.routed_experts = RoutedExperts(jnp.zeros(_EMPTY, jnp.int32))
    return len(layers)


@contextlib.contextmanager
def replaying(model: Any, experts: Int[Array, "B T layers k"] | None):
    """Within a traced function: every MoE layer of `model` routes the forwards run in the
    block with `experts[:, :, layer]` (None: the layers route themselves); the slots are
    empty again after it."""
    layers = moe_layers(model)
    if experts is not None:
        for i, layer in enumerate(layers):
            layer.routed_experts.set_value(experts[:, :, i].astype(jnp.int32))
    try:
        yield
    finally:
        for layer in layers:
            layer.routed_experts.set_value(jnp.zeros(_EMPTY, jnp.int32))


def _install() -> None:
    module = tunix_compat.model_module("qwen3", "model")
    moe = module.MoELayer
    if getattr(moe.__call__, _MARK, False):
        return
    original = moe.__call__

    @functools.wraps(original)
    def call(self, x, *args, **kwargs):
        slot = getattr(self, "routed_experts", None)
        experts = slot.value if isinstance(slot, RoutedExperts) and slot.value.ndim == 3 else None
        token = _LAYER.set((experts, _CAPTURE.get()))
        try:
            return original(self, x, *args, **kwargs)
        finally:
            _LAYER.reset(token)

    setattr(call, _MARK, True)
    moe.__call__ = call
    if not isinstance(module.jax, _RoutingJax):
        module.jax = _RoutingJax()


class _RoutingLax:
    """`jax.lax` as tunix's qwen3 model module sees it: `top_k` replays inside a MoE layer."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jax.lax, name)

    def top_k(self, operand, k: int):
        weights, chosen = jax.lax.top_k(operand, k)
        layer = _LAYER.get()
        if layer is None:
            return weights, chosen
        experts, captured = layer
        if experts is not None:
            replayed = experts.astype(chosen.dtype)
            chosen = jnp.where(jnp.all(replayed >= 0, axis=-1, keepdims=True), replayed, chosen)
            weights = jnp.take_along_axis(operand, chosen, axis=-1)
        if captured is not None:
            captured.append(chosen)
        return weights, chosen


class _RoutingJax:
    """`jax` as tunix's qwen3 model module sees it (`_RoutingLax` as `lax`)."""

    lax = _RoutingLax()

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)


@functools.partial(nnx.jit, static_argnames=("pad_id", "eos_id", "temperature"))
def routing_and_logps(
    model: Any,
    prompt_tokens: Int[Array, "B P"],
    completion_tokens: Int[Array, "B C"],
    experts: Int[Array, "B T layers k"] | None,
    pad_id: int,
    eos_id: int,
    temperature: float,
) -> tuple[Float[Array, "B C"], Int[Array, "B T layers k"]]:
    """tunix's trainer logprobs of the completions at `temperature` (its `process_ids`, the
    model, `selective_log_softmax`, as `compute_per_token_logps` runs them) and the experts
    each MoE layer used for every input position, replaying `experts` where given."""
    tokens, positions, mask, _ = tunix_compat.process_ids(
        prompt_tokens, completion_tokens, pad_id, eos_id
    )
    captured: list = []
    token = _CAPTURE.set(captured)
    try:
        with replaying(model, experts):
            logits, _ = model(tokens, positions=positions, attention_mask=mask, cache=None)
    finally:
        _CAPTURE.reset(token)
    width = completion_tokens.shape[1]
    logits = logits[:, -width - 1 : -1, :] / temperature
    logps = tunix_compat.selective_log_softmax(logits, completion_tokens)
    return logps, jnp.stack(captured, axis=2)


def input_routing(
    out: Any, prompt_width: int, completion_width: int
) -> Int[np.ndarray, "B T layers k"]:
    """A rollout output's routed experts (`RolloutOutputWithEntropy.prompt_routed_experts`,
    `.routed_experts`) in the layout of the trainer's input: prompts left-padded to
    `prompt_width`, completions right-padded to `completion_width`, -1 at every pad."""
    if getattr(out, "routed_experts", None) is None:  # tunix's own outputs lack the field
        raise ValueError(
            "routing replay needs the rollout's routed experts: serve the MoE with "
            "EngineSettings(return_routed_experts=True)"
        )
    _, layers, k = out.routed_experts[0].shape
    rows = len(out.routed_experts)
    routing = np.full((rows, prompt_width + completion_width, layers, k), -1, np.int32)
    for i, (prompt, completion) in enumerate(
        zip(out.prompt_routed_experts, out.routed_experts, strict=True)
    ):
        p, c = min(len(prompt), prompt_width), min(len(completion), completion_width)
        routing[i, prompt_width - p : prompt_width] = prompt[len(prompt) - p :]
        routing[i, prompt_width : prompt_width + c] = completion[:c]
    return routing


def mismatch_frac(
    rollout: Int[np.ndarray, "B T layers k"],
    trainer: Int[np.ndarray, "B T layers k"],
    mask: Bool[np.ndarray, "B T"],
) -> Float[np.ndarray, " layers"]:
    """Per layer, the share of the masked positions whose set of experts differs between the
    rollout and the trainer (the order within a token's top-k does not matter)."""
    differs = np.any(np.sort(rollout, axis=-1) != np.sort(trainer, axis=-1), axis=-1)
    weight = np.asarray(mask, bool)[:, :, None]
    return (differs & weight).sum(axis=(0, 1)) / max(1, int(weight.sum()))


def own_routing_mismatch(
    model: Any, out: Any, pad_id: int, eos_id: int
) -> Float[np.ndarray, " layers"]:
    """Per layer, the share of a rollout output's input positions whose experts `model`,
    routing itself, chooses otherwise than the rollout did."""
    from sgl_jax_rollout.rollout_inputs import right_pad_ids
    from tunix_adapter.process_batch import widest

    width = widest(max(1, max(len(t) for t in out.tokens)))
    prompts = np.asarray(out.left_padded_prompt_tokens)
    routing = input_routing(out, prompts.shape[1], width)
    _, used = routing_and_logps(
        model,
        jnp.asarray(prompts),
        jnp.asarray(right_pad_ids(out.tokens, width, pad_id)),
        None,
        pad_id=pad_id,
        eos_id=eos_id,
        temperature=1.0,
    )
    return mismatch_frac(routing, np.asarray(used), routing[..., 0, 0] >= 0)
