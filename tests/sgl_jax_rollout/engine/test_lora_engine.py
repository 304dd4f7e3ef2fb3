"""LoRA served unmerged by the engine (engine-marked; own engines, run before the session
rollout starts: tests/conftest.py).

A qwix actor with two rules of different rank and alpha (q_proj rank 4, alpha 16; the other
projections rank 8, alpha 4): the float32 engine's logprobs are the LoRA trainer's (tunix's
trainer-side logprobs) to 1e-4, which one `lora_scaling` for every module could not give, and
its weights hold the actor's frozen base untouched beside the adapters, and an update of the
base alone keeps the adapters. Then `check
--lora-rank 16` on a bfloat16 engine: small adapters (most of `s * A @ B` below half a
bfloat16 step of `W`) are served whole.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.engine

MODULES = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"


def test_mixed_rules_are_served_as_the_trainer_computes_them(tiny_dir):
    import jax
    import qwix
    from flax import nnx

    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tests.conftest import one_bucket_settings, perturbed
    from tests.sgl_jax_rollout.test_rollout import config as rollout_config
    from tunix_adapter.check import lora_update_error
    from tunix_adapter.models import load_tunix_model
    from tunix_adapter.scoring import before_pad, trainer_logps

    provider = qwix.LoraProvider(
        [
            qwix.LoraRule(module_path=".*q_proj", rank=4, alpha=16.0),
            qwix.LoraRule(module_path=MODULES, rank=8, alpha=4.0),
        ]
    )
    base = load_tunix_model(tiny_dir)
    actor = qwix.apply_lora_to_model(base, provider, **base.get_model_input())
    nnx.update(actor, perturbed(nnx.state(actor, nnx.LoRAParam), scale=0.05, seed=3))
    settings = one_bucket_settings(rows=4, tokens=512, context_length=512, total=2048)
    rollout = SglangJaxRollout(rollout_actor=actor, model_path=tiny_dir, engine_settings=settings)
    try:
        config = rollout_config(max_tokens_to_generate=16, max_prompt_length=128, seed=0)
        prompts = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(40 + 9 * i)) for i in range(4)]
        out = rollout.generate(prompts, config)
        reference = trainer_logps(rollout, actor, out, 1.0)
        pad = rollout.pad_id()
        gaps = [
            np.abs(np.asarray(lp)[: before_pad(t, pad)] - reference[i, : before_pad(t, pad)])
            for i, (lp, t) in enumerate(zip(out.logprobs, out.tokens, strict=True))
        ]
        assert max(g.max() for g in gaps) < 1e-4
        assert lora_update_error(rollout, actor) < 1e-6
        # The frozen base is served as it is: no adapter was merged into it.
        engine = {
            ".".join(map(str, p)): np.asarray(v.value)
            for p, v in rollout.engine.engine_state().flat_state()
        }
        q = np.asarray(nnx.state(actor, nnx.Param)["layers"][0]["attn"]["q_proj"]["w"].value)
        np.testing.assert_array_equal(
            engine["model.layers.0.self_attn.q_proj.base_layer.weight"], q.reshape(q.shape[0], -1)
        )
        # Not vacuous: without the adapters the trainer's logprobs move well past 1e-4.
        plain = trainer_logps(rollout, base, out, 1.0)
        assert np.abs(plain - reference)[:, :4].max() > 1e-2
        assert jax.tree_util.tree_leaves(nnx.state(actor, nnx.LoRAParam))
        # An update of the base alone (a plain model's weights) writes the base layers and
        # keeps the adapters' buffers as they are (`bench weights` times this update).
        new_base = perturbed(nnx.state(load_tunix_model(tiny_dir), nnx.Param), scale=0.05, seed=4)
        rollout.update_params(new_base)
        after = {
            ".".join(map(str, p)): np.asarray(v.value)
            for p, v in rollout.engine.engine_state().flat_state()
        }
        q = np.asarray(new_base["layers"][0]["attn"]["q_proj"]["w"].value)
        np.testing.assert_array_equal(
            after["model.layers.0.self_attn.q_proj.base_layer.weight"], q.reshape(q.shape[0], -1)
        )
        buffers = [name for name in engine if name.endswith(("A_buffer", "B_buffer"))]
        assert buffers and all(np.array_equal(after[n], engine[n]) for n in buffers)
    finally:
        rollout.shutdown()


def test_check_lora_row_passes_on_a_bfloat16_engine(tiny_dir):
    from tunix_adapter import check

    config = check.CheckConfig(
        model_path=str(tiny_dir),
        lora_rank=16,
        prompts=1,
        prompt_tokens=256,
        max_tokens=8,
        engine_settings={"dtype": "bfloat16"},
        trainer_dtype="float32",  # adapters trained in float32 (a bfloat16 trainer's copy exactly)
    )
    rows = {row.check: row for row in check.run(config)}
    row = rows["LoRA update served, small B (rel. error, bfloat16)"]
    # float32 factors rounded to bfloat16 move by 2^-9 each: the served update is the trainer's
    # to ~0.3%; a merge rounded to bfloat16 weights would serve almost none of it (error near 1).
    assert row.ok and 0 < row.value < 1e-2, row
    assert all(r.ok for r in rows.values()), [r.row() for r in rows.values() if not r.ok]
