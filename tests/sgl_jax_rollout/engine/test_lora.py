"""`engine.lora` against qwix's own LoRA forward (no engine needed).

The factors in the engine's buffer layout (`engine_factors`: A `(1, rank, in)`, B `(1, out,
rank)` with the module's scaling folded in) must compute what the qwix model computes: the
base model with `W + (B_buf @ A_buf).T` (reshaped to W) gives the qwix model's logits, here
with two qwix rules of different rank and alpha, so padding and per-module scaling are both
exercised. Then the layout's reading of qwix rules and its refusals.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgl_jax_rollout.engine.lora import (
    LORA_A,
    LORA_B,
    LoraLayout,
    engine_factors,
    lora_layout,
    lora_names,
    split_update,
)
from tests.conftest import perturbed

MODULES = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"


def adapt(tiny_dir, provider):
    from tunix_adapter.models import load_tunix_model

    base = load_tunix_model(tiny_dir)
    import qwix

    adapted = qwix.apply_lora_to_model(base, provider, **base.get_model_input())
    # Trained adapters: B is zero at init, which would make any layout look right.
    factors = nnx.state(adapted, nnx.LoRAParam)
    nnx.update(adapted, perturbed(factors, scale=0.05, seed=1))
    return base, adapted


@pytest.fixture(scope="module")
def mixed(tiny_dir):
    import qwix

    provider = qwix.LoraProvider(
        [
            qwix.LoraRule(module_path=".*q_proj", rank=4, alpha=16.0),  # scaling 4
            qwix.LoraRule(module_path=MODULES, rank=8, alpha=4.0),  # scaling 0.5
        ]
    )
    return adapt(tiny_dir, provider)


def logits(model, tokens):
    positions = jnp.arange(tokens.shape[1])[None, :].repeat(tokens.shape[0], 0)
    mask = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), bool))[None]
    out, _ = model(tokens, positions, None, mask)
    return np.asarray(out, np.float64)


def test_engine_layout_computes_what_the_qwix_model_computes(mixed):
    base, adapted = mixed
    layout = lora_layout(adapted, None)
    assert layout.rank == 8
    assert layout.modules == (
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    )
    assert layout.scaling("layers.0.attn.q_proj.w") == 4.0
    assert layout.scaling("layers.1.mlp.down_proj.kernel") == 0.5
    state = nnx.state(adapted, nnx.Param)
    factors = engine_factors(state.filter(nnx.LoRAParam), layout)
    # Fresh Variables: the state's own are the adapted model's.
    weights = jax.tree_util.tree_map(lambda x: x, state.filter(nnx.Not(nnx.LoRAParam)))
    flat = {tuple(path): v for path, v in weights.flat_state()}
    pairs = {}
    for path, v in factors.flat_state():
        name = str(path[-1])
        suffix = LORA_A if name.endswith(LORA_A) else LORA_B
        pairs.setdefault((*path[:-1], name.removesuffix(suffix)), {})[suffix] = np.asarray(v.value)
    assert len(pairs) == 7 * 2
    for target, pair in pairs.items():
        a, b = pair[LORA_A], pair[LORA_B]
        assert a.shape[:2] == (1, 8) and b.shape[0] == 1 and b.shape[2] == 8
        w = flat[target]
        delta = (b[0].astype(np.float64) @ a[0].astype(np.float64)).T  # (in, out)
        w.value = jnp.asarray(
            np.asarray(w.value, np.float64) + delta.reshape(w.value.shape), w.value.dtype
        )
    nnx.update(base, weights)
    tokens = jnp.asarray(np.random.default_rng(0).integers(10, 900, (2, 24)), jnp.int32)
    expected = logits(adapted, tokens)
    np.testing.assert_allclose(logits(base, tokens), expected, atol=2e-4, rtol=0)
    # Not vacuous: one scaling for every module (what one lora_scaling served) moves the
    # logits far past the tolerance.
    uniform = LoraLayout(
        rank=8, modules=layout.modules, scalings=tuple((t, 1.0) for t, _ in layout.scalings)
    )
    wrong = engine_factors(state.filter(nnx.LoRAParam), uniform)
    assert not np.allclose(
        np.asarray(wrong["layers"][0]["attn"]["q_proj"]["w_lora_b"].value),
        np.asarray(factors["layers"][0]["attn"]["q_proj"]["w_lora_b"].value),
    )


def test_one_lora_scaling_serves_an_actor_without_rules(tiny_dir):
    import qwix

    _, adapted = adapt(tiny_dir, qwix.LoraProvider(module_path=MODULES, rank=4, alpha=8.0))
    assert {s for _, s in lora_layout(adapted, None).scalings} == {2.0}
    assert {s for _, s in lora_layout(adapted, 2.0).scalings} == {2.0}
    with pytest.raises(ValueError, match=r"lora_scaling=3.0 contradicts .*alpha / rank = 2.0"):
        lora_layout(adapted, 3.0)
    plain = type(adapted).__mro__[1]  # the model class without qwix's intercepted __call__
    adapted.__class__ = plain
    with pytest.raises(ValueError, match=r"no qwix LoraProvider rules .*\(lora_scaling="):
        lora_layout(adapted, None)
    assert {s for _, s in lora_layout(adapted, 2.0).scalings} == {2.0}


def test_ranks_that_differ_without_rules_are_refused_by_name(mixed):
    _, adapted = mixed
    cls = adapted.__class__
    adapted.__class__ = cls.__mro__[1]
    try:
        with pytest.raises(ValueError, match=r"different ranks \(.*q_proj.w rank 4"):
            lora_layout(adapted, 2.0)
    finally:
        adapted.__class__ = cls


def test_factors_that_do_not_fit_are_refused_by_name(mixed):
    _, adapted = mixed
    layout = lora_layout(adapted, None)
    factors = nnx.state(adapted, nnx.LoRAParam)
    unpaired = jax.tree_util.tree_map(lambda x: x, factors)
    del unpaired["layers"][0]["attn"]["q_proj"]["w_lora_b"]
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.q_proj\.w come unpaired"):
        engine_factors(unpaired, layout)
    wrong = jax.tree_util.tree_map(lambda x: x, factors)
    b = wrong["layers"][0]["attn"]["k_proj"]["w_lora_b"]
    b.value = jnp.zeros((3, *b.value.shape[1:]), b.value.dtype)
    with pytest.raises(ValueError, match=r"k_proj\.w \(\(64, 8\) x \(3, .* do not pair"):
        engine_factors(wrong, layout)
    other = LoraLayout(rank=8, modules=("q_proj",), scalings=layout.scalings[:1])
    with pytest.raises(
        ValueError, match=r"adapt layers\.0\.attn\.[a-z]+_proj\.w, which the rollout"
    ):
        engine_factors(jax.tree_util.tree_map(lambda x: x, factors), other)


def test_lora_updates_need_the_lora_actor(mixed):
    _, adapted = mixed
    state = nnx.state(adapted, nnx.Param)
    assert lora_names(state)
    with pytest.raises(ValueError, match="without a LoRA actor: build it with rollout_actor="):
        split_update(state, None)
    base, lora = split_update(nnx.state(adapted, nnx.LoRAParam), adapted)
    assert lora_names(lora) and not lora_names(base) and jax.tree_util.tree_leaves(base)
