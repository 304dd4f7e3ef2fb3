"""`rope_phases` (`patches/agreement.py`): sgl-jax's rotary embeddings, built while an engine's
hooks are active, compute their phases by the engine's rule (against `rope_phases.cos_sin`,
itself checked bit for bit against tunix in `test_rope_phases.py`) or upstream's; RoPE with
frequencies of its own stays upstream's. No engine starts."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.engine  # needs sgl-jax importable (no engine is started)

POSITIONS = jnp.arange(0, 2048, dtype=jnp.int32)


def _hooks(rule: str, norm: str | None = None):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.engine.collector import Collector
    from sgl_jax_rollout.engine.numerics import TrainerRounding

    patches.apply()
    return patches.EngineHooks(
        collector=Collector(),
        valid_vocab_size=None,
        rope_phases=rule,
        numerics=TrainerRounding(norm=norm),
    )


@contextlib.contextmanager
def _engine(rule: str, norm: str | None = None):
    """An engine's hooks active, as while it builds and traces its model (none starts)."""
    from sgl_jax_rollout.engine import patches

    hooks = _hooks(rule, norm)
    patches.activate(hooks, 0.0)
    try:
        yield
    finally:
        patches.deactivate(hooks)


def _embeddings():
    """A plain, a linearly scaled (Gemma 3) and a llama3-scaled rotary embedding, the first
    from sgl-jax's `get_rope`, which caches it for every later caller in the process."""
    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.models.gemma3 import LinearScalingRotaryEmbedding

    get_rope = upstream.get("get_rope")
    return (
        get_rope(128, 128, 4096, 1_000_000, is_neox_style=True, dtype=jnp.float32),
        LinearScalingRotaryEmbedding(256, 256, 4096, 1_000_000, True, jnp.float32, 8.0),
        upstream.get("Llama3RotaryEmbedding")(
            64, 64, 4096, 500_000, True, jnp.float32, 32.0, 1.0, 4.0, 8192
        ),
    )


def _upstream(rotary) -> tuple[np.ndarray, np.ndarray]:
    """sgl-jax's phases: position times the numpy inverse frequencies the embedding holds."""
    phase = POSITIONS.astype(jnp.float32)[:, None] * jnp.asarray(rotary._inv_freq_np)
    return np.asarray(jnp.cos(phase)), np.asarray(jnp.sin(phase))


def _computed(rotary, monkeypatch) -> tuple[tuple[np.ndarray, np.ndarray], list[str]]:
    """`rotary`'s phases and the rules `rope_phases.cos_sin` was asked for on the way.

    Whether the two rules round differently depends on the CPU: on AMD EPYC, XLA's
    `position / timescale` is bit for bit `position * inv_freq` (0 of 131,072 phases differ);
    elsewhere over 1% of them did. So the rule asked for is checked too, which fails on any
    CPU when the wiring breaks."""
    from sgl_jax_rollout.engine import rope_phases

    asked = []
    real = rope_phases.cos_sin

    def spy(positions, rotary_dim, base, rule, scaling_factor=1.0):
        asked.append(rule)
        return real(positions, rotary_dim, base, rule, scaling_factor)

    monkeypatch.setattr(rope_phases, "cos_sin", spy)
    got = rotary._compute_cos_sin(POSITIONS)
    monkeypatch.setattr(rope_phases, "cos_sin", real)
    return (np.asarray(got[0]), np.asarray(got[1])), asked


def test_rotary_embeddings_compute_their_phases_by_the_running_engines_rule(monkeypatch):
    from sgl_jax_rollout.engine import rope_phases

    with _engine("timescale"):
        plain, linear, llama3 = _embeddings()
        for rotary, scale in ((plain, 1.0), (linear, 8.0)):
            got, asked = _computed(rotary, monkeypatch)
            assert asked == ["timescale"]
            want = rope_phases.cos_sin(
                POSITIONS, rotary.rotary_dim, rotary.base, "timescale", scale
            )
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        # llama3 scaling has frequencies of its own: upstream's phases, under any rule
        got, asked = _computed(llama3, monkeypatch)
        assert asked == [] and np.array_equal(got[0], _upstream(llama3)[0])

    with _engine("inv_freq"):
        for rotary in _embeddings():
            got, asked = _computed(rotary, monkeypatch)
            assert asked == []
            np.testing.assert_array_equal(got[0], _upstream(rotary)[0])
            np.testing.assert_array_equal(got[1], _upstream(rotary)[1])


def test_two_engines_of_one_process_each_compute_with_their_own_rule(monkeypatch):
    """sgl-jax's `get_rope` hands the second engine the embedding it cached for the first (or
    for a caller outside any engine): the rule must be the engine's that runs it, whatever
    was active when the embedding was built (it was stored on the embedding, and leaked)."""
    outside = _embeddings()[0]  # built with no engine active
    for rule in ("inverse_timescale", "inv_freq", "timescale"):
        with _engine(rule):
            plain = _embeddings()[0]
            assert plain is outside  # the cached one
            _, asked = _computed(plain, monkeypatch)
            assert asked == ([] if rule == "inv_freq" else [rule])
    _, asked = _computed(outside, monkeypatch)
    assert asked == []  # no engine running: upstream's


def test_the_setting_is_refused_by_name_and_resolved_per_model_type():
    from sgl_jax_rollout.engine.settings import EngineSettings

    with pytest.raises(ValueError, match="rope_phases must be one of"):
        EngineSettings(rope_phases="transformers")
    assert EngineSettings().rope_phases == "trainer"
    with pytest.raises(ValueError, match="numerics must be one of"):
        EngineSettings(numerics="bfloat16")
    assert EngineSettings().numerics == "trainer"


def test_trainer_rounding_follows_tunix_where_it_has_the_model():
    """`numerics.trainer_rounding`: tunix's norm order and rounded attention weights for its
    Qwen and Llama models (the weights for Gemma 4 too), the router of Qwen3-MoE, RoPE in float32
    for Llama and Gemma 2 / 3, the norm and the attention softmax in the activation dtype for
    Gemma 2 / 3, upstream's for models tunix lacks and under numerics="sgl-jax"."""
    from sgl_jax_rollout.engine.numerics import TrainerRounding, trainer_rounding

    assert trainer_rounding("qwen3", "trainer") == TrainerRounding("weight_times_normed", True)
    moe = TrainerRounding("weight_times_normed", True, router_in_dtype=True)
    assert trainer_rounding("qwen3_moe", "trainer") == moe
    llama = TrainerRounding(None, True, rope_in_float32=True)  # its norm: numerics.py
    assert trainer_rounding("llama", "trainer") == llama
    assert trainer_rounding("gemma4", "trainer") == TrainerRounding(None, True)
    for model_type in ("gemma2", "gemma3_text"):
        expected = TrainerRounding(gemma_norm=True, softmax_in_dtype=True, rope_in_float32=True)
        assert trainer_rounding(model_type, "trainer") == expected
    assert trainer_rounding("phi3", "trainer") == TrainerRounding()
    assert trainer_rounding("qwen3", "sgl-jax") == TrainerRounding()


def _tunix_norm(package: str, x, weight):
    """tunix's RMS norm of `package` (`models/qwen3/model.py` `RMSNorm`) on `x`."""
    from flax import nnx

    from sgl_jax_rollout import tunix_compat

    model = tunix_compat.model_module(package, "model")
    dtypes = dict(dtype=x.dtype, param_dtype=x.dtype)
    norm = model.RMSNorm(x.shape[-1], norm_eps=1e-6, rngs=nnx.Rngs(0), **dtypes)
    norm.w.value = weight
    return np.asarray(norm(x).astype(jnp.float32))


@pytest.mark.parametrize(("package", "rule"), [("qwen3", "weight_times_normed")])
def test_bfloat16_rms_norms_weigh_in_the_running_engines_rule(package, rule):
    """`rms_norm_order`: sgl-jax's RMSNorm in bfloat16 gives tunix's norm bit for bit under the
    engine's rule, its own (which differs from tunix's in some elements) without one, and
    float32 norms stay upstream's under the rule."""
    from sgl_jax_rollout.engine import upstream

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(0, 3, size=(512, 1024)), jnp.bfloat16)
    weight = jnp.asarray(rng.normal(1, 0.3, size=1024), jnp.bfloat16)
    with jax.set_mesh(jax.make_mesh((1,), ("data",))):  # sgl-jax's layers shard their weights
        norm = upstream.get("RMSNorm")(
            1024, epsilon=1e-6, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16
        )
        f32 = upstream.get("RMSNorm")(1024, epsilon=1e-6, dtype=jnp.float32)
    norm.scale.value = weight
    f32.scale.value = weight.astype(jnp.float32)
    tunix = _tunix_norm(package, x, weight)
    with _engine("inv_freq", rule):
        ruled = np.asarray(norm(x).astype(jnp.float32))
        f32_ruled = np.asarray(f32(x.astype(jnp.float32)))
    with _engine("inv_freq"):
        upstreams = np.asarray(norm(x).astype(jnp.float32))
    np.testing.assert_array_equal(ruled, tunix)
    assert np.sum(upstreams != tunix) >= 1  # the rounding the rule removes (rare per element)
    np.testing.assert_array_equal(f32_ruled, np.asarray(f32(x.astype(jnp.float32))))


@pytest.mark.parametrize("package", ["gemma", "gemma3"])
def test_bfloat16_gemma_norms_compute_in_bfloat16_as_tunix_does(package):
    """`gemma_norm_in_dtype`: sgl-jax's GemmaRMSNorm in bfloat16 gives tunix's Gemma 2 / 3
    norm bit for bit with the engine's rounding (its residual add kept), its float32 one (many
    elements apart) without."""
    from flax import nnx

    from sgl_jax_rollout import tunix_compat
    from sgl_jax_rollout.engine import patches, upstream
    from sgl_jax_rollout.engine.collector import Collector
    from sgl_jax_rollout.engine.numerics import TrainerRounding

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(0, 3, size=(256, 640)), jnp.bfloat16)
    residual = jnp.asarray(rng.normal(0, 3, size=(256, 640)), jnp.bfloat16)
    weight = jnp.asarray(rng.normal(0, 0.5, size=640), jnp.bfloat16)
    tunix = tunix_compat.model_module(package, "model").RMSNorm(640, rngs=nnx.Rngs(0))
    tunix.scale.value = weight
    want = np.asarray(tunix(x + residual).astype(jnp.float32))
    norm = upstream.get("GemmaRMSNorm")(640, epsilon=1e-6)
    norm.weight.value = weight.astype(jnp.float32)  # sgl-jax keeps it in float32
    patches.apply()
    hooks = patches.EngineHooks(
        collector=Collector(), valid_vocab_size=None, numerics=TrainerRounding(gemma_norm=True)
    )
    patches.activate(hooks, 0.0)
    try:
        out, summed = norm(x, residual)
    finally:
        patches.deactivate(hooks)
    np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), want)
    np.testing.assert_array_equal(np.asarray(summed), np.asarray(x + residual))
    theirs, _ = norm(x, residual)
    assert np.mean(np.asarray(theirs.astype(jnp.float32)) != want) > 0.05


def test_bfloat16_router_rounds_as_tunix_qwen3_moe_does():
    """`router_in_dtype`: sgl-jax's GateLogit and TopK on bfloat16 hidden states, the routing
    weights then as the wrapped `EPMoE.__call__` hands them on, give tunix's Qwen3-MoE routing
    (`models/qwen3/model.py` `MoELayer.__call__`: a bfloat16 `nnx.Linear`, softmax and
    renormalised top-k in float32, weights rounded to bfloat16) bit for bit: the same experts
    and weights. Upstream's float32 logits give other weights and, at near-ties, other
    experts."""
    from flax import nnx

    from sgl_jax_rollout.engine import patches, upstream
    from sgl_jax_rollout.engine.collector import Collector
    from sgl_jax_rollout.engine.numerics import TrainerRounding
    from sgl_jax_rollout.engine.patches import agreement

    rng = np.random.default_rng(2)
    hidden = jnp.asarray(rng.normal(0, 1, size=(2048, 256)), jnp.bfloat16)
    kernel = jnp.asarray(rng.normal(0, 0.05, size=(256, 64)), jnp.bfloat16)
    router = nnx.Linear(
        256, 64, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
    )
    router.kernel.value = kernel
    weights, experts = jax.lax.top_k(jax.nn.softmax(router(hidden).astype(jnp.float32), -1), 8)
    weights = (weights / jnp.sum(weights, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    with jax.set_mesh(jax.make_mesh((1,), ("data",))):  # sgl-jax's layers shard their weights
        gate = upstream.get("GateLogit")(256, 64)
    gate.kernel.value = kernel.astype(jnp.float32)  # as the bfloat16 checkpoint loads into it
    topk = upstream.module("layers.gate").TopK(topk=8, renormalize=True)  # upstream's, as is

    def route():
        # The experts' compute is a test double: it returns the weights it was handed.
        served, ids = topk(gate(hidden))
        return agreement._experts_by_rule(lambda _, h, w, i: w, None, hidden, served, ids), ids

    patches.apply()
    hooks = patches.EngineHooks(
        collector=Collector(), valid_vocab_size=None, numerics=TrainerRounding(router_in_dtype=True)
    )
    patches.activate(hooks, 0.0)
    try:
        ruled, ruled_ids = route()
    finally:
        patches.deactivate(hooks)
    np.testing.assert_array_equal(np.asarray(ruled_ids), np.asarray(experts))
    np.testing.assert_array_equal(np.asarray(ruled), np.asarray(weights.astype(jnp.float32)))
    theirs, their_ids = route()
    assert np.mean(np.asarray(theirs) != np.asarray(weights.astype(jnp.float32))) > 0.5
    assert np.any(np.asarray(their_ids) != np.asarray(experts))


@pytest.mark.parametrize("package", ["llama3", "gemma3"])
def test_bfloat16_rope_rotates_in_float32_as_tunix_does(package):
    """`rope_in_float32`: sgl-jax's RotaryEmbedding on bfloat16 query and key, with the
    engine's phases ("timescale") and rotation in float32, gives tunix's Llama 3 / Gemma 3
    `apply_rope` (float32 cos and sin, the result rounded once) bit for bit past position
    1,024; with cos and sin rounded first (upstream's, and tunix's Qwen3) many elements
    differ."""
    from sgl_jax_rollout import tunix_compat
    from sgl_jax_rollout.engine import patches, upstream
    from sgl_jax_rollout.engine.collector import Collector
    from sgl_jax_rollout.engine.numerics import TrainerRounding

    rng = np.random.default_rng(3)
    tokens, heads, head_dim, base = 256, 4, 128, 10_000
    positions = jnp.arange(1024, 1024 + tokens, dtype=jnp.int32)
    query = jnp.asarray(rng.normal(0, 2, size=(tokens, heads * head_dim)), jnp.bfloat16)
    key = jnp.asarray(rng.normal(0, 2, size=(tokens, heads * head_dim)), jnp.bfloat16)
    apply_rope = tunix_compat.model_module(package, "model").apply_rope
    kwargs = {"rope_theta": base} if package == "llama3" else {"base_frequency": base}

    def tunix(x):
        inputs = x.reshape(1, tokens, heads, head_dim)
        out = apply_rope(inputs, positions[None], head_dim=head_dim, **kwargs)
        return np.asarray(out.reshape(tokens, -1).astype(jnp.float32))

    rotary = upstream.get("get_rope")(
        head_dim, head_dim, 4096, base, is_neox_style=True, dtype=jnp.bfloat16
    )
    patches.apply()

    def engine(rounding):
        hooks = patches.EngineHooks(
            collector=Collector(), valid_vocab_size=None, rope_phases="timescale", numerics=rounding
        )
        patches.activate(hooks, 0.0)
        try:
            q, k = rotary(positions, query, key)
        finally:
            patches.deactivate(hooks)
        return np.asarray(q.astype(jnp.float32)), np.asarray(k.astype(jnp.float32))

    q, k = engine(TrainerRounding(rope_in_float32=True))
    np.testing.assert_array_equal(q, tunix(query))
    np.testing.assert_array_equal(k, tunix(key))
    rounded_first, _ = engine(TrainerRounding())
    assert np.mean(rounded_first != tunix(query)) > 0.05
