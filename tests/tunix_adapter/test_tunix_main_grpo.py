"""tunix main's own GRPO on our rollout (`use_rollout_logps`, `sampler_is="token"`), and our
`RolloutGRPOConfig` mapped onto tunix main's switches. Marked `tunix_main` (and `engine`): it
runs where tunix has those switches (`make test-tunix-main`) and skips on tunix 0.1.7."""

import numpy as np
import pytest

from sgl_jax_rollout_apps import demo
from tests.tunix_adapter.training_helpers import engine_config, train_and_capture

pytestmark = [pytest.mark.engine, pytest.mark.tunix_main]


def test_tunix_mains_grpo_takes_our_rollout_logprobs_for_its_token_tis(tiny_dir, monkeypatch):
    from sgl_jax_rollout.tunix_compat import GRPOConfig, GRPOLearner
    from tunix_adapter.rewards import vowel_word_reward

    config = engine_config(
        tiny_dir,
        steps=2,
        prompts_per_step=2,
        num_generations=2,
    )

    def tunix_learner(config, cluster, reward):
        algo = GRPOConfig(
            num_generations=config.num_generations,
            beta=0.0,  # no reference model in the demo's cluster
            use_rollout_logps=True,
            sampler_is="token",
            sampler_is_threshold=2.0,
        )
        return GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=[vowel_word_reward])

    monkeypatch.setattr(demo, "_learner", tunix_learner)
    _, examples, *_ = train_and_capture(config)
    assert len(examples) == 2
    for example in examples:
        mask = np.asarray(example.completion_mask)
        weights = np.asarray(example.sampler_is_weights)
        # weights = min(exp(trainer - rollout), 2) under the mask: our logprobs agree with the
        # trainer's to float32 noise (the demo samples at T = 1 without top-k / top-p), so 1.
        np.testing.assert_allclose(weights[mask], 1.0, atol=1e-4)
        assert np.all(weights[~mask] == 0)


def test_rollout_grpo_config_sets_tunix_mains_switches():
    from tunix_adapter.learners import RolloutGRPOConfig

    assert RolloutGRPOConfig(num_generations=2).use_rollout_logps is True
    tis = RolloutGRPOConfig(num_generations=2, use_rollout_logprobs=False, tis_cap=2.0)
    assert tis.use_rollout_logps is False and tis.sampler_is is None
    with pytest.raises(ValueError, match="sampler_is='token' is tunix main's TIS"):
        RolloutGRPOConfig(num_generations=2, sampler_is="token")
    with pytest.raises(ValueError, match="use_rollout_logps=False"):
        RolloutGRPOConfig(num_generations=2, use_rollout_logps=False)
