"""The two places a rejected token can go, through tunix's own GRPO loss (`grpo_loss_fn`, the
tiny trainer model), against references written from each peer's loss code in float64:

- TRL (`GRPOTrainer`, trl f2cd577 `trl/trainer/grpo_trainer.py`: `vllm_importance_sampling_mode
  ="token_mask"` fills the ratio with 0 outside the bounds, `per_token_loss *= ratio`, then
  `+ beta * per_token_kl`, normalised by the unchanged completion mask; `loss_type="grpo"` is a
  per-sequence token mean, `"bnpo"` a token mean) for `is_rejection="zero_weight"`;
- verl (518bada21: `rollout_corr_helper.compute_rollout_correction_and_add_to_batch` sets
  `response_mask *= rs_mask`; `core_algos.compute_policy_loss_vanilla` multiplies the clipped
  term by `rollout_is_weights` and `agg_loss` aggregates over the response mask, as
  `dp_actor` does for the KL loss) for `is_rejection="response_mask"`.

The learner hands tunix `apply_correction`'s mask and weights; tunix's loss must then be each
peer's loss, and the two must differ where tokens were rejected.
"""

import numpy as np
import pytest

from tunix_adapter.off_policy import OffPolicyCorrection, apply_correction

PAD, EOS = 0, 1
EPSILON, BETA = 0.2, 0.05


def _batch(vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows, prompt_len, width = 6, 5, 10
    prompt = rng.integers(2, vocab, (rows, prompt_len))
    lengths = np.array([10, 7, 3, 9, 5, 8])
    mask = np.arange(width)[None, :] < lengths[:, None]
    completion = np.where(mask, rng.integers(2, vocab, (rows, width)), PAD)
    return prompt, completion, mask, rng


def _ppo_term(logp, old, adv):
    """-min(A r, A clip(r)) (TRL's and verl's clipped objective; tunix's `max` of negatives),
    and verl's dual clip at 3 for A < 0 (the ratios here never reach it)."""
    ratio = np.exp(logp - old)
    term = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - EPSILON, 1 + EPSILON))
    assert ratio.max() < 3
    return np.where(adv < 0, np.minimum(-adv * 3.0, term), term)


def _k3(logp, ref):
    return np.exp(ref - logp) - (ref - logp) - 1


def _mean(values, mask, agg):
    if agg == "token-mean":
        return (values * mask).sum() / mask.sum()
    rows = mask.sum(-1) > 0
    per_row = (values * mask).sum(-1)[rows] / mask.sum(-1)[rows]
    return per_row.mean()


def trl_loss(logp, old, ref, adv, ratio_weights, mask, agg):
    per_token = _ppo_term(logp, old, adv) * ratio_weights + BETA * _k3(logp, ref)
    if agg == "token-mean":  # loss_type="bnpo"
        return (per_token * mask).sum() / max(mask.sum(), 1)
    # loss_type="grpo": every row's token mean, averaged over rows
    return ((per_token * mask).sum(-1) / np.maximum(mask.sum(-1), 1)).mean()


def verl_loss(logp, old, ref, adv, is_weights, response_mask, agg):
    pg = _mean(_ppo_term(logp, old, adv) * is_weights, response_mask, agg)
    return pg + BETA * _mean(_k3(logp, ref), response_mask, agg)


@pytest.mark.parametrize("agg", ["sequence-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_each_rejection_is_its_peers_loss_through_tunix(trainer, agg, level):
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout import tunix_compat
    from tunix_adapter.learners import RolloutGRPOConfig

    prompt, completion, mask, rng = _batch(trainer.config.vocab_size)
    graphdef, state = nnx.split(trainer)
    logp, _ = tunix_compat.per_token_logps_and_logits(
        graphdef, state, jnp.asarray(prompt), jnp.asarray(completion), PAD, EOS, 1.0
    )
    logp = np.asarray(logp, np.float64)
    old = logp + rng.normal(0, 0.1, mask.shape)  # the trainer under the weights that sampled
    rollout = old + rng.normal(0, 0.3 if level == "token" else 0.15, mask.shape)
    ref = logp + rng.normal(0, 0.2, mask.shape)
    adv = rng.normal(0, 1, (len(mask), 1))
    upper, lower = 1.4, 0.6
    algo = RolloutGRPOConfig(
        num_generations=2,
        beta=BETA,
        epsilon=EPSILON,
        loss_agg_mode=agg,
        kl_loss_mode="low_var_kl",
        use_rollout_logprobs=False,
        is_correction=f"{level}-mask",
        is_threshold=upper,
        is_threshold_lower=lower,
    )
    algo.temperature = 1.0  # what tunix's learner sets from the rollout config

    def tunix_loss(rejection):
        correction = OffPolicyCorrection(level, "mask", upper, lower, rejection=rejection)
        loss_mask, weights = apply_correction(old, rollout, mask, correction, False)
        example = tunix_compat.TrainExample(
            prompt_ids=jnp.asarray(prompt),
            prompt_mask=jnp.ones(prompt.shape, jnp.int32),
            completion_ids=jnp.asarray(completion),
            completion_mask=jnp.asarray(loss_mask, jnp.int32),
            advantages=jnp.asarray(adv[:, 0], jnp.float32),
            ref_per_token_logps=jnp.asarray(ref, jnp.float32),
            old_per_token_logps=jnp.asarray(old, jnp.float32),
            sampler_is_weights=jnp.asarray(weights),
        )
        loss = tunix_compat.grpo_loss(trainer, example, algo, PAD, EOS)
        return float(loss), loss_mask, weights

    # the reference ratios, from the peers' formulas
    delta = np.where(mask, old - rollout, 0.0)
    log_r = delta if level == "token" else np.broadcast_to(delta.sum(-1, keepdims=True), mask.shape)
    r = np.exp(np.clip(log_r, -20, 20))
    inside = (r >= lower) & (r <= upper)
    assert 0 < (mask & ~inside).sum() < mask.sum()  # something rejected, something kept
    if level == "sequence":  # a whole sequence rejected: it leaves verl's sequence mean
        assert (mask & inside).any(-1).sum() < mask.any(-1).sum()

    got_trl, trl_mask, _ = tunix_loss("zero_weight")
    want_trl = trl_loss(logp, old, ref, adv, np.where(inside, r, 0.0), mask, agg)
    np.testing.assert_array_equal(trl_mask, mask)
    assert got_trl == pytest.approx(want_trl, rel=2e-5, abs=1e-6)

    got_verl, verl_mask, _ = tunix_loss("response_mask")
    # rollout_is=level with rollout_is_threshold=upper, rollout_rs=level with the same bounds
    want_verl = verl_loss(logp, old, ref, adv, np.minimum(r, upper), mask & inside, agg)
    np.testing.assert_array_equal(verl_mask, mask & inside)
    assert got_verl == pytest.approx(want_verl, rel=2e-5, abs=1e-6)

    # where tokens were rejected the two semantics give different losses
    assert abs(want_trl - want_verl) > 1e-3
