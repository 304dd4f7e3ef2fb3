"""Gemma's LoRA factors in sgl-jax's static LoRA buffers, against qwix's own deltas (no engine).

qwix adapts tunix Gemma's attention einsums by their weights' contracted and kept axes, with
the einsum it stores on each module (`w_lora_einsum_str`, e.g. `BSD,Dr,rCKH->CBSKH` for
`kv_einsum`); the engine serves separate `q_proj` / `k_proj` / `v_proj` / `o_proj` layers
computing `(x @ A_buf.T) @ B_buf.T`. For every adapted module of a layer, the engine modules'
outputs on random inputs must be qwix's delta (float64), K and V taken from their halves of
`kv_einsum`'s B. Trained adapters (B drawn, not qwix's zeros) with two rules of different rank
and alpha, so padding and per-module scaling are exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from sgl_jax_rollout.engine.gemma_mapping import engine_lora_buffers
from sgl_jax_rollout.engine.lora import engine_factors, lora_layout
from tests.conftest import perturbed


@pytest.fixture(scope="module")
def actor(tmp_path_factory):
    import qwix

    from sgl_jax_rollout.tiny_model import make_tiny_model
    from tunix_adapter.cluster import LORA_MODULES
    from tunix_adapter.models import load_tunix_model

    model_dir = make_tiny_model(tmp_path_factory.mktemp("gemma") / "g2", like="gemma-2-2b-it")
    base = load_tunix_model(model_dir)
    provider = qwix.LoraProvider(
        [
            qwix.LoraRule(module_path=".*kv_einsum", rank=2, alpha=6.0),  # scaling 3
            qwix.LoraRule(module_path=LORA_MODULES, rank=4, alpha=2.0),  # scaling 0.5
        ]
    )
    adapted = qwix.apply_lora_to_model(base, provider, **base.get_model_input())
    nnx.update(adapted, perturbed(nnx.state(adapted, nnx.LoRAParam), scale=0.05, seed=1))
    return adapted


def f64(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def test_engine_buffers_compute_qwix_deltas(actor):
    layout = lora_layout(actor, None)
    assert layout.rank == 4
    # The engine's module names, not tunix's einsums.
    projections = ("q", "k", "v", "o", "gate", "up", "down")
    assert set(layout.modules) == {f"{m}_proj" for m in projections}
    factors = engine_factors(nnx.state(actor, nnx.LoRAParam), layout)
    buffers = engine_lora_buffers(
        {".".join(map(str, path)): v.value for path, v in factors.flat_state()}
    )
    layers = len(actor.layers)
    assert len(buffers) == layers * 7 * 2

    def served(layer: int, block: str, module: str, x: np.ndarray) -> np.ndarray:
        prefix = f"model.layers.{layer}.{block}.{module}"
        a, b = f64(buffers[f"{prefix}.A_buffer"][0]), f64(buffers[f"{prefix}.B_buffer"][0])
        return (x @ a.T) @ b.T

    rng = np.random.default_rng(0)
    for layer in range(layers):
        attn, mlp = actor.layers[layer].attn, actor.layers[layer].mlp
        tokens = 5
        x = rng.normal(size=(tokens, f64(attn.q_einsum.w.value).shape[1]))

        def qwix_delta(module, lhs, scaling):
            a, b = f64(module.w_lora_a.value), f64(module.w_lora_b.value)
            return np.einsum(module.w_lora_einsum_str, lhs, a, b) * scaling

        q = qwix_delta(attn.q_einsum, x[None], 0.5)[0]  # (T, N, H)
        np.testing.assert_allclose(
            served(layer, "self_attn", "q_proj", x), q.reshape(tokens, -1), atol=1e-5
        )
        kv = qwix_delta(attn.kv_einsum, x[None], 3.0)[:, 0]  # (2, T, K, H)
        for c, module in enumerate(("k_proj", "v_proj")):
            np.testing.assert_allclose(
                served(layer, "self_attn", module, x), kv[c].reshape(tokens, -1), atol=1e-5
            )
        heads, head_dim, _ = f64(attn.attn_vec_einsum.w.value).shape
        encoded = rng.normal(size=(tokens, heads, head_dim))
        o = qwix_delta(attn.attn_vec_einsum, encoded[None], 0.5)[0]
        np.testing.assert_allclose(
            served(layer, "self_attn", "o_proj", encoded.reshape(tokens, -1)), o, atol=1e-5
        )
        for name in ("gate_proj", "up_proj", "down_proj"):
            linear = getattr(mlp, name)
            a, b = f64(linear.kernel_lora_a.value), f64(linear.kernel_lora_b.value)
            h = rng.normal(size=(tokens, a.shape[0]))
            np.testing.assert_allclose(served(layer, "mlp", name, h), h @ a @ b * 0.5, atol=1e-5)
    # Not vacuous: K and V's halves differ, so a swap or a shared B would fail above.
    assert not np.allclose(kv[0], kv[1], atol=1e-3)


def test_unknown_factors_are_refused_by_name():
    with pytest.raises(ValueError, match=r"no sgl-jax Gemma LoRA buffer for tunix's "):
        engine_lora_buffers({"embedder.input_embedding_lora_a": np.zeros((1, 2, 3))})
