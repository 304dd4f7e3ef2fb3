"""`engine.lora.merge_lora` against qwix's own LoRA forward (no engine needed).

The merged base model must compute what the LoRA model computes: same logits from the tunix
model with `W + scaling * A @ B` as from the qwix-adapted model with factors A, B.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgl_jax_rollout.engine.lora import lora_names, merge_lora
from tests.conftest import perturbed

MODULES = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"


@pytest.fixture(scope="module")
def models(tiny_dir):
    import qwix

    from tunix_adapter.models import load_tunix_model

    base = load_tunix_model(tiny_dir)
    adapted = qwix.apply_lora_to_model(
        load_tunix_model(tiny_dir),
        qwix.LoraProvider(module_path=MODULES, rank=4, alpha=8.0),
        **base.get_model_input(),
    )
    # Trained adapters: B is zero at init, which would make any merge look right.
    factors = nnx.state(adapted, nnx.LoRAParam)
    nnx.update(adapted, perturbed(factors, scale=0.05, seed=1))
    return base, adapted


def logits(model, tokens):
    positions = jnp.arange(tokens.shape[1])[None, :].repeat(tokens.shape[0], 0)
    mask = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), bool))[None]
    out, _ = model(tokens, positions, None, mask)
    return np.asarray(out, np.float64)


def test_merged_base_computes_what_the_lora_model_computes(models):
    base, adapted = models
    state = nnx.state(adapted, nnx.Param)
    factors = state.filter(nnx.LoRAParam)
    assert len(lora_names(factors)) == 2 * 7 * 2  # 7 projections x 2 layers, A and B
    merged = merge_lora(state.filter(nnx.Not(nnx.LoRAParam)), factors, 8.0 / 4)
    nnx.update(base, merged)
    tokens = jnp.asarray(np.random.default_rng(0).integers(10, 900, (2, 24)), jnp.int32)
    expected = logits(adapted, tokens)
    got = logits(base, tokens)
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=0)
    # Not vacuous: without the adapters the logits move far more than the tolerance.
    plain = merge_lora(state.filter(nnx.Not(nnx.LoRAParam)), factors, 0.0)
    nnx.update(base, plain)
    assert np.abs(logits(base, tokens) - expected).max() > 1e-2


def test_factors_that_do_not_fit_their_parameter_are_refused_by_name(models):
    _, adapted = models
    state = nnx.state(adapted, nnx.Param)
    base = state.filter(nnx.Not(nnx.LoRAParam))
    factors = state.filter(nnx.LoRAParam)
    unpaired = jax.tree_util.tree_map(lambda x: x, factors)
    del unpaired["layers"][0]["attn"]["q_proj"]["w_lora_b"]
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.q_proj\.w come unpaired"):
        merge_lora(jax.tree_util.tree_map(lambda x: x, base), unpaired, 2.0)
    orphan = jax.tree_util.tree_map(lambda x: x, base)
    del orphan["layers"][1]["mlp"]["up_proj"]
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.up_proj\.kernel, which the base"):
        merge_lora(orphan, jax.tree_util.tree_map(lambda x: x, factors), 2.0)
    wrong = jax.tree_util.tree_map(lambda x: x, factors)
    a = wrong["layers"][0]["attn"]["k_proj"]["w_lora_a"]
    a.value = jnp.zeros((32, a.value.shape[-1]), a.value.dtype)
    with pytest.raises(ValueError, match=r"k_proj\.w \(\(32, 4\) x .* do not give"):
        merge_lora(jax.tree_util.tree_map(lambda x: x, base), wrong, 2.0)
