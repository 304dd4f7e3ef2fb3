"""Routing replay end to end on the float32 Qwen3-MoE replica (engine-marked; one engine at a
time, each shut down before the session rollout starts (tests/conftest.py)):

- the engine's routed experts, per completion and per prompt, are the experts tunix's trainer
  chooses itself on the same tokens (float32: no flip), on every position: the alignment;
- a GRPO run with `routing_replay` trains, keeps rollout and trainer logprobs within 1e-4, logs
  a routing mismatch of 0 and hands the loss the rollout's experts; the loss provably uses
  them: the same example with other experts gives another loss.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sgl_jax_rollout.tiny_model.builder import MOE_EXPERTS, MOE_TOP_K
from tests.tunix_adapter.training_helpers import changed, engine_config, train_and_capture

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("moe") / "moe", like="qwen3-30b-a3b", dtype="float32"
    )


def test_grpo_with_routing_replay_uses_the_rollouts_experts(moe_dir):
    import jax.numpy as jnp

    cfg = engine_config(moe_dir, steps=2, routing_replay=True)
    history, examples, before, after, cluster = train_and_capture(cfg)
    assert len(history) == len(examples) == 2
    assert changed(before, after)
    for row in history:
        assert row["logp_diff_max"] < 1e-4, row
        # the trainer, routing itself under the weights that sampled, chose the rollout's
        # experts on every input position (computed by the learner at each step)
        assert row["rollout/routing_mismatch_frac"] == 0.0, row
    example = examples[-1]
    routed = np.asarray(example.routed_experts)
    prompts, completions = np.asarray(example.prompt_ids), np.asarray(example.completion_ids)
    assert routed.shape == (len(prompts), prompts.shape[1] + completions.shape[1], 2, MOE_TOP_K)
    pad = cluster.rollout.pad_id()
    # -1 exactly at the pads and at each completion's last token (never an input)
    missing = np.concatenate([prompts, completions], axis=1) == pad
    last = prompts.shape[1] + (completions != pad).sum(axis=1) - 1
    missing[np.arange(len(last)), last] = True
    np.testing.assert_array_equal(routed[..., 0, 0] < 0, missing)
    assert np.all((routed[~missing] >= 0) & (routed[~missing] < MOE_EXPERTS))

    # the loss reads the example's experts: the same example with others gives another loss
    model = cluster.actor_trainer.model
    loss_fn = cluster.actor_trainer.loss_fn
    algo = cluster.actor_trainer.gen_model_input_fn(example)["algo_config"]
    shifted = jnp.where(jnp.asarray(routed) >= 0, (jnp.asarray(routed) + 1) % MOE_EXPERTS, -1)
    loss = _loss(loss_fn(model, example, algo))
    other = _loss(loss_fn(model, dataclasses.replace(example, routed_experts=shifted), algo))
    assert abs(other - loss) > 1e-4, (loss, other)
    again = _loss(loss_fn(model, example, algo))
    assert again == pytest.approx(loss, abs=1e-6)  # the slots were emptied


def test_the_old_policy_of_several_iterations_is_scored_with_this_batchs_replayed_routing(
    moe_dir, monkeypatch
):
    """verl's R3 with the trainer as the old policy (`num_iterations=2`, TIS, so
    `use_rollout_logprobs=False`): tunix 0.1.7 asks for the old logprobs inside its batch
    production (`get_old_per_token_logps`), tunix main through `get_actor_per_token_logps`.
    Both are answered replayed with the batch's own experts (before the learner had read them
    the first batch failed, under 0.1.7 with an AttributeError), never by tunix's trainer
    routing itself; in float32 they equal the rollout's logprobs."""
    from sgl_jax_rollout import tunix_compat

    scored = []
    own = tunix_compat.RLCluster.get_actor_per_token_logps
    monkeypatch.setattr(
        tunix_compat.RLCluster,
        "get_actor_per_token_logps",
        lambda self, *a, **k: scored.append(1) or own(self, *a, **k),
    )
    # tunix counts optimizer updates as steps: 2 of them are one batch's two iterations
    cfg = engine_config(moe_dir, steps=2, routing_replay=True, num_iterations=2, tis_cap=10.0)
    history, examples, *_ = train_and_capture(cfg)
    assert len(examples) == 1 and not scored
    for example in examples:
        mask = np.asarray(example.completion_mask, bool)
        old, rollout = np.asarray(example.old_per_token_logps), np.asarray(example.rollout_logprobs)
        np.testing.assert_allclose(old[mask], rollout[mask], atol=1e-4)
    assert all(row["rollout/routing_mismatch_frac"] == 0.0 for row in history), history


def _loss(out) -> float:
    """The value of tunix's GRPO loss: 0.1.7 returns (loss, aux), main a `LossOutput` whose
    primary loss is a weighted sum and its denominator."""
    if isinstance(out, tuple):
        return float(out[0])
    return float(out.primary_loss.unreduced_sum) / float(out.primary_loss.denominator)


@pytest.mark.parametrize("page_size", [1, 64])  # 64: the TPU presets' page size
def test_routing_is_returned_per_token_and_per_prompt_and_a_cached_prompt_keeps_its_own(
    moe_dir, page_size
):
    """Each completion's routing has one row per token (the last -1), each prompt's one per
    prompt token; a prompt served again from the prefix cache returns the routing it was
    computed with, the float32 trainer routes every position as the rollout did, and a
    session's turns keep the routing aligned with their tokens, also once exported for training."""
    import jax.numpy as jnp

    from sgl_jax_rollout import tunix_compat
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.rollout_inputs import right_pad_ids
    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from tests.conftest import small_engine_settings
    from tunix_adapter import routing_replay
    from tunix_adapter.models import load_tunix_model
    from tunix_adapter.sessions import grpo_batch

    rollout = SglangJaxRollout(
        model_path=moe_dir,
        engine_settings=small_engine_settings(return_routed_experts=True, page_size=page_size),
    )
    try:
        prompts = ["the cat sat on the mat " * 6, "a dog", "why is the sky blue? " * 3]

        def sample(seed: int):
            config = RolloutConfig(
                max_tokens_to_generate=12,
                max_prompt_length=128,
                temperature=1.0,
                top_p=1.0,
                top_k=None,
                seed=seed,
                return_logprobs=True,
            )
            return rollout.generate(prompts, config)

        first, second = sample(0), sample(1)
        pad = rollout.pad_id()
        for out in (first, second):
            for tokens, routed, prompt_routed, padded in zip(
                out.tokens,
                out.routed_experts,
                out.prompt_routed_experts,
                out.left_padded_prompt_tokens,
                strict=True,
            ):
                assert routed.shape == (len(tokens), 2, MOE_TOP_K) and routed.dtype == np.int32
                assert (routed[-1] == -1).all() and (routed[:-1] >= 0).all()
                assert prompt_routed.shape == (int((np.asarray(padded) != pad).sum()), 2, MOE_TOP_K)
        for a, b in zip(first.prompt_routed_experts, second.prompt_routed_experts, strict=True):
            np.testing.assert_array_equal(a, b)

        trainer = load_tunix_model(moe_dir)
        routing_replay.enable(trainer)
        prompt_ids = np.asarray(second.left_padded_prompt_tokens)
        completions = right_pad_ids(second.tokens, 12, pad)
        routing = routing_replay.input_routing(second, prompt_ids.shape[1], 12)
        _, own = routing_replay.routing_and_logps(
            trainer,
            jnp.asarray(prompt_ids),
            jnp.asarray(completions),
            None,
            pad_id=pad,
            eos_id=rollout.eos_id(),
            temperature=1.0,
        )
        positions = routing[..., 0, 0] >= 0
        assert positions.sum() > 100
        mismatch = routing_replay.mismatch_frac(routing, np.asarray(own), positions)
        assert mismatch.tolist() == [0.0, 0.0]

        # a session's nodes carry the whole conversation's routing, aligned with its tokens;
        # the second turn keeps the first turn's rows and routes its last token
        config = RolloutConfig(max_tokens_to_generate=8, temperature=1.0, top_p=1.0, seed=3)
        with rollout.session(rollout_config=config) as session:
            (first,) = session.chat([{"role": "user", "content": "tell me a story"}])
            (turn,) = session.chat_extend(first, [{"role": "user", "content": "again"}])
            for node in (first, turn):
                assert node.routed_experts.shape == (len(node.tokens), 2, MOE_TOP_K)
                assert (node.routed_experts[-1] == -1).all()
                assert (node.routed_experts[:-1] >= 0).all()
            earlier = len(first.tokens) - 1
            np.testing.assert_array_equal(turn.routed_experts[:earlier], first.routed_experts[:-1])
            (trajectory,) = session.trajectories()
            assert trajectory["routed_experts"] is turn.routed_experts
        # exported for training, the session's routing sits where the trainer's input puts
        # each token: the float32 trainer routes every position as the engine did
        batch = grpo_batch([trajectory], pad_id=pad, max_prompt_length=64, max_response_length=64)
        _, own = routing_replay.routing_and_logps(
            trainer,
            jnp.asarray(batch.prompt_ids),
            jnp.asarray(batch.completion_ids),
            None,
            pad_id=pad,
            eos_id=rollout.eos_id(),
            temperature=1.0,
        )
        positions = batch.routed_experts[..., 0, 0] >= 0
        assert positions.sum() == len(turn.tokens) - 1
        mismatch = routing_replay.mismatch_frac(batch.routed_experts, np.asarray(own), positions)
        assert mismatch.tolist() == [0.0, 0.0]
        if tunix_compat.has_experimental():  # tunix main: its Sampler's routed experts
            _sampler_returns_the_routing(rollout, config)
    finally:
        rollout.shutdown()


def _sampler_returns_the_routing(rollout, config) -> None:
    """`SglangJaxSampler`'s `routed_experts`, tunix's `[batch, layers, length, top_k]`: the
    routing the rollout returns for the same seeded request, over prompt + completion."""
    import asyncio

    from sgl_jax_rollout import tunix_compat as tc
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    ids = rollout.prompt_token_ids(["why is the sky blue?"], 64)[0]
    params = tc.TunixSamplingParams(max_tokens=8, seed=4)
    request = tc.SamplingRequest(request_id="moe", prompt=ids, sampling_params=params)
    response = asyncio.run(SglangJaxSampler("moe", rollout).sample(request))
    routed = np.asarray(response.routed_experts)
    assert routed.shape == (1, 2, len(ids) + len(response.token_ids), MOE_TOP_K)
    same = rollout.generate_from_ids([ids], dataclasses.replace(config, seed=4))
    assert same.tokens[0].tolist() == response.token_ids.tolist()
    own = np.concatenate([same.prompt_routed_experts[0], same.routed_experts[0]])
    np.testing.assert_array_equal(routed[0], own.transpose(1, 0, 2))
    assert (routed[0, :, -1] == -1).all() and (routed[0, :, :-1] >= 0).all()


def test_a_dense_model_refuses_routed_experts_before_the_engine_starts(tiny_dir):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tests.conftest import small_engine_settings

    with pytest.raises(ValueError, match="return_routed_experts needs a mixture-of-experts"):
        SglangJaxRollout(
            model_path=tiny_dir, engine_settings=small_engine_settings(return_routed_experts=True)
        )
    assert patches.current() is None


def test_check_passes_a_bfloat16_moe_by_scoring_with_the_rollouts_experts(tmp_path):
    """`check` on the bfloat16 replica (the checkpoint's dtype): rounding sends some positions
    to another expert (the row without replay is above 0), which alone would fail the
    logprob rows; scored with the rollout's experts, every row passes."""
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from tunix_adapter import check

    model_dir = make_tiny_model(tmp_path / "moe", like="qwen3-30b-a3b")
    rows = check.run(
        check.CheckConfig(model_path=str(model_dir), prompts=1, prompt_tokens=600, max_tokens=16)
    )
    by_name = {row.check: row for row in rows}
    assert by_name["MoE: positions routed otherwise without replay"].value > 0
    failed = [f"{row.check}: {row.value:.3g} (limit {row.limit})" for row in rows if not row.ok]
    assert not failed, "; ".join(failed)
