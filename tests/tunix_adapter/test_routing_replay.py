"""Routing replay on tunix's Qwen3-MoE trainer model, without the engine: a replayed MoE layer
computes what a float64 numpy MoE computes for the forced experts (router probabilities of
those experts, renormalised), the router still gets a gradient, replaying the trainer's own
routing changes nothing, forcing another one changes the logprobs, and the layout and metric
helpers against hand-built arrays."""

from __future__ import annotations

import types

import numpy as np
import pytest

from sgl_jax_rollout.tiny_model.builder import MOE_EXPERTS, MOE_TOP_K


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from tunix_adapter import routing_replay
    from tunix_adapter.models import load_tunix_model

    path = make_tiny_model(
        tmp_path_factory.mktemp("moe") / "moe", like="qwen3-30b-a3b", dtype="float32"
    )
    model = load_tunix_model(path)
    assert routing_replay.enable(model) == 2
    return model


def _numpy_moe(mlp, x: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """HF's Qwen3-MoE block in float64 with the experts forced: softmax over the router's
    logits, the forced experts' probabilities renormalised, SwiGLU experts summed."""
    x = x.astype(np.float64)
    router = np.asarray(mlp.router.kernel.value, np.float64)
    logits = x @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    weights = np.take_along_axis(probs, experts, axis=-1)
    weights /= weights.sum(-1, keepdims=True)
    gate, up, down = (
        np.asarray(p.value, np.float64) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    )
    out = np.zeros_like(x)
    for slot in range(experts.shape[-1]):
        e = experts[..., slot]
        h = np.einsum("btd,btdf->btf", x, gate[e])
        silu = h / (1.0 + np.exp(-h))
        y = np.einsum("btf,btfd->btd", silu * np.einsum("btd,btdf->btf", x, up[e]), down[e])
        out += weights[..., slot, None] * y
    return out


def test_a_replayed_layer_computes_the_forced_experts_mixture(moe_model):
    import jax.numpy as jnp

    from tunix_adapter import routing_replay

    mlp = routing_replay.moe_layers(moe_model)[0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    forced = np.stack([rng.permutation(MOE_EXPERTS)[:MOE_TOP_K] for _ in range(10)])
    forced = forced.reshape(2, 5, MOE_TOP_K)
    forced[1, 4] = -1  # a row of -1: the layer's own choice
    own = np.asarray(mlp(jnp.asarray(x)))
    mlp.routed_experts.set_value(jnp.asarray(forced, jnp.int32))
    try:
        replayed = np.asarray(mlp(jnp.asarray(x)))
    finally:
        mlp.routed_experts.set_value(jnp.zeros((0,), jnp.int32))
    probs = x.astype(np.float64) @ np.asarray(mlp.router.kernel.value, np.float64)
    own_top = np.argsort(-probs, axis=-1)[..., :MOE_TOP_K]
    expected_experts = np.where(forced >= 0, forced, own_top)
    expected = _numpy_moe(mlp, x, expected_experts)
    np.testing.assert_allclose(replayed, expected, atol=2e-5, rtol=1e-4)
    assert np.abs(replayed - own).max() > 1e-2  # the forced experts were not the layer's own
    np.testing.assert_allclose(replayed[1, 4], own[1, 4], atol=1e-6)  # -1 kept its own
    np.testing.assert_allclose(own, _numpy_moe(mlp, x, own_top), atol=2e-5, rtol=1e-4)


def test_replay_of_the_own_routing_changes_nothing_and_another_routing_does(moe_model):
    import jax
    import jax.numpy as jnp

    from tunix_adapter import routing_replay

    rng = np.random.default_rng(1)
    prompts = jnp.asarray(rng.integers(10, 1000, (2, 6)), jnp.int32)
    completions = jnp.asarray(rng.integers(10, 1000, (2, 5)), jnp.int32)
    kwargs = dict(pad_id=0, eos_id=2, temperature=1.0)
    own, used = routing_replay.routing_and_logps(moe_model, prompts, completions, None, **kwargs)
    assert used.shape == (2, 11, 2, MOE_TOP_K)
    same, used_again = routing_replay.routing_and_logps(
        moe_model, prompts, completions, used, **kwargs
    )
    np.testing.assert_array_equal(np.asarray(used_again), np.asarray(used))
    np.testing.assert_allclose(np.asarray(same), np.asarray(own), atol=1e-6)
    shifted = (used + 1) % MOE_EXPERTS
    other, used_other = routing_replay.routing_and_logps(
        moe_model, prompts, completions, shifted, **kwargs
    )
    np.testing.assert_array_equal(np.asarray(used_other), np.asarray(shifted))
    assert np.abs(np.asarray(other) - np.asarray(own)).max() > 1e-2
    # the slots are empty again: a forward after the replay routes itself
    after, _ = routing_replay.routing_and_logps(moe_model, prompts, completions, None, **kwargs)
    np.testing.assert_allclose(np.asarray(after), np.asarray(own), atol=1e-6)

    # the router's weights of the replayed experts carry a gradient to the router
    from flax import nnx

    def loss(model):
        logps, _ = routing_replay.routing_and_logps(model, prompts, completions, shifted, **kwargs)
        return logps.sum()

    grads = nnx.grad(loss)(moe_model)
    router = grads["layers"][0]["mlp"]["router"]["kernel"].value
    assert float(jnp.abs(router).max()) > 0
    assert jax.tree_util.tree_leaves(nnx.state(moe_model, routing_replay.RoutedExperts))[
        0
    ].shape == (0,)


def test_input_routing_lays_prompts_left_and_completions_right_with_minus_one_pads():
    from tunix_adapter import routing_replay

    prompt = [np.full((3, 2, 2), 1, np.int32), np.full((1, 2, 2), 2, np.int32)]
    completion = [np.full((2, 2, 2), 3, np.int32), np.full((4, 2, 2), 4, np.int32)]
    out = types.SimpleNamespace(routed_experts=completion, prompt_routed_experts=prompt)
    routing = routing_replay.input_routing(out, prompt_width=4, completion_width=3)
    assert routing.shape == (2, 7, 2, 2) and routing.dtype == np.int32
    first = routing[0, :, 0, 0].tolist()
    assert first == [-1, 1, 1, 1, 3, 3, -1]
    assert routing[1, :, 0, 0].tolist() == [-1, -1, -1, 2, 4, 4, 4]  # cut at the width
    with pytest.raises(ValueError, match="return_routed_experts"):
        routing_replay.input_routing(
            types.SimpleNamespace(routed_experts=None, prompt_routed_experts=None), 4, 3
        )


def test_mismatch_frac_counts_sets_of_experts_over_the_masked_positions():
    from tunix_adapter import metrics, routing_replay

    rollout = np.array([[[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[0, 2], [1, 3]]]])  # [1, 3, 2, 2]
    trainer = rollout.copy()
    trainer[0, 0, 0] = [1, 0]  # same set, other order: no mismatch
    trainer[0, 1, 1] = [6, 5]  # layer 1 differs at position 1
    trainer[0, 2, 0] = [7, 7]  # masked out
    mask = np.array([[True, True, False]])
    frac = routing_replay.mismatch_frac(rollout, trainer, mask)
    np.testing.assert_allclose(frac, [0.0, 0.5])
    named = metrics.routing_metrics(frac)
    assert named["rollout/routing_mismatch_frac"][0] == 0.25
    assert named["rollout/routing_mismatch_frac/layer_1"][0] == 0.5


def test_a_dense_model_is_refused_by_name(tmp_path):
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from tunix_adapter import routing_replay
    from tunix_adapter.models import load_tunix_model

    dense = load_tunix_model(make_tiny_model(tmp_path / "dense"))
    with pytest.raises(ValueError, match="routing replay needs a tunix Qwen3 MoE model"):
        routing_replay.enable(dense)
