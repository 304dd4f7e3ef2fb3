"""GRPO and EGPO, two steps each, on tunix's VanillaRollout with entropy from our sampler module.

Runs in CI (no sgl_jax): the trainer-side wiring (cluster, learner, EGPO estimator, metrics)
on the same learner code the engine tests use with SglangJaxRollout.
"""

import numpy as np
import pytest

from sgl_jax_rollout import tunix_compat
from sgl_jax_rollout_apps import demo
from tests.tunix_adapter.training_helpers import changed, check_example, train_and_capture
from tunix_adapter.egpo import EgpoSettings, egpo_advantages, think_span_entropy
from tunix_adapter.rewards import vowel_word_reward


@pytest.fixture(scope="module")
def model_dir(tiny_dir):
    return str(tiny_dir)


@pytest.mark.parametrize(("algo", "tis_cap"), [("grpo", None), ("egpo", None), ("grpo", 2.0)])
def test_two_steps_on_the_vanilla_rollout(algo, tis_cap, model_dir, tmp_path):
    config = demo.DemoConfig(
        algo=algo,
        tis_cap=tis_cap,
        rollout="vanilla",
        steps=2,
        model_path=model_dir,
        out=str(tmp_path),
        show_progress=False,
    )
    history, examples, before, after, cluster = train_and_capture(config)
    assert len(history) == 2 and len(examples) == 2
    pad = cluster.rollout.pad_id()
    for example in examples:
        check_example(example, config, pad)
    assert changed(before, after)
    # vanilla samples with the actor's own weights: the trainer recomputation agrees
    assert history[0]["logp_diff_max"] < 1e-4
    assert all(0 < row["entropy_mean"] < np.log(1024) for row in history)
    assert (tmp_path / "metrics.png").stat().st_size > 0
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    # The advantages are the configured estimator's, on this batch's rewards (and entropy).
    example, rollout = examples[-1], cluster.last_rollout
    rewards = np.asarray(vowel_word_reward(None, rollout.text))
    g = config.num_generations
    if algo == "egpo":
        settings = EgpoSettings(think_start_id=4, think_end_id=5)
        h = think_span_entropy(
            np.asarray(example.rollout_entropy),
            np.asarray(example.completion_ids),
            np.asarray(example.completion_mask),
            settings,
        )
        assert h.std() > 0
        expected = egpo_advantages(rewards, g, h, settings)
        assert not np.allclose(expected, egpo_advantages(rewards, g, 0 * h, settings))
    else:
        expected = tunix_compat.get_advantage_estimator("grpo")(rewards, g)
    np.testing.assert_allclose(np.asarray(example.advantages), expected, rtol=1e-5, atol=1e-6)


def test_cluster_keeps_entropy_in_order_across_rollout_micro_batches(model_dir):
    import optax

    from sgl_jax_rollout.tunix_compat import RLTrainingConfig, RolloutConfig
    from tunix_adapter.cluster import build_cluster

    cluster = build_cluster(
        rollout="vanilla",
        model_path=model_dir,
        # top_p None: tunix's vanilla sampler is greedy, so both calls sample the same tokens
        rollout_config=RolloutConfig(
            max_tokens_to_generate=8, max_prompt_length=16, top_p=None, kv_cache_size=64
        ),
        training_config=RLTrainingConfig(
            actor_optimizer=optax.sgd(1e-3), eval_every_n_steps=1, max_steps=1
        ),
        with_reference=False,
    )
    prompts = demo.prompts(6, seed=3)
    whole = cluster.generate(prompts)
    split = cluster.generate(prompts, micro_batch_size=2)  # tunix merges 3 outputs
    assert split is cluster.last_rollout and len(split.entropy) == len(prompts)
    for i in range(len(prompts)):
        assert split.tokens[i].tolist() == whole.tokens[i].tolist()
        assert len(split.entropy[i]) == len(split.tokens[i]) == len(split.logprobs[i])
        np.testing.assert_allclose(split.entropy[i], whole.entropy[i], atol=1e-4)
