"""GRPO and EGPO, two steps each, on tunix's VanillaRollout with entropy from our sampler module.

Runs in CI (no sgl_jax): the trainer-side wiring (cluster, learner, EGPO estimator, metrics)
on the same learner code the engine tests use with SglangJaxRollout.
"""

import json

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
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    # every metric the learner logged, under its own name, beside the short names
    logged = {
        "rollout/entropy_mean",
        "rollout/entropy_p90",
        "sampler_trainer/logp_diff_mean",
        "rollout_corr/kl",
        "rewards/pass@1",
        f"rewards/pass@{config.num_generations}",
    }
    if tis_cap is not None:
        logged |= {
            "rollout_corr/rollout_is_max",
            "sampler_is/weight_mean",
            "off_policy/weight_mean",
        }
    for line in lines:
        assert logged <= set(line), logged - set(line)
        assert line["logp_diff_mean"] == line["rollout/trainer_logp_abs_diff_mean"]
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


def test_two_batches_produced_at_once_keep_their_own_rows(model_dir):
    """tunix prepares training batches on its data thread while its main thread prepares
    evaluation batches (at once where the rollout has devices of its own). Here batch A's
    thread stops right after its rollout returns until batch B, on another thread, is
    complete: A's example must still carry A's rollout (entropy, logprobs) and A's trainer
    scores, B's B's."""
    import threading

    from sgl_jax_rollout.rollout_inputs import right_pad_values
    from sgl_jax_rollout.tunix_compat import Mode

    config = demo.DemoConfig(
        rollout="vanilla",
        steps=1,
        model_path=model_dir,
        show_progress=False,
        is_correction="token-mask",  # the trainer as old policy: its scores are checked
    )
    cluster, learner = demo.build(config)
    # what `train` sets from its first batch before producing any
    learner._rollout_micro_batch_size = learner._compute_logps_micro_batch_size = 2
    # tunix 0.1.7 buffers an evaluation metric only after a training one (`RLCluster.
    # buffer_metrics` reads `_buffered_train_metrics[0]`), as its loop guarantees
    cluster.buffer_metrics({"warm_up": (0.0, np.mean)}, mode=Mode.TRAIN)
    g = config.num_generations
    batches = {
        "A": {"prompts": np.repeat(np.array(demo.prompts(2, seed=1)), g)},
        "B": {"prompts": np.repeat(np.array(demo.prompts(2, seed=2)), g)},
    }
    generated, examples, errors = {}, {}, []
    b_done = threading.Event()
    original = cluster.generate

    def generate(prompts, *args, **kwargs):
        out = original(prompts, *args, **kwargs)
        name = threading.current_thread().name
        generated[name] = out
        if name == "A":
            assert b_done.wait(600), "batch B never finished"
        return out

    cluster.generate = generate  # what tunix's learner calls for each batch

    def produce(name, mode):
        try:
            examples[name] = learner._generate_and_compute_advantage(batches[name], mode)
        except BaseException as err:  # reported below
            errors.append(err)
        finally:
            if name == "B":
                b_done.set()

    a = threading.Thread(target=produce, args=("A", Mode.TRAIN), name="A")
    a.start()
    while "A" not in generated and a.is_alive():
        a.join(0.05)
    b = threading.Thread(target=produce, args=("B", Mode.EVAL), name="B")
    b.start()
    b.join(900)
    a.join(900)
    assert not errors, errors
    for name in ("A", "B"):
        example, out = examples[name], generated[name]
        width = np.asarray(example.completion_ids).shape[1]
        mask = np.asarray(example.completion_mask, bool)
        np.testing.assert_array_equal(
            np.asarray(example.rollout_entropy), right_pad_values(out.entropy, width) * mask
        )
        np.testing.assert_array_equal(
            np.asarray(example.rollout_logprobs), right_pad_values(out.logprobs, width) * mask
        )
        # the trainer's scores are this batch's: vanilla samples with the actor's weights
        weights = np.asarray(example.sampler_is_weights)
        np.testing.assert_allclose(weights[mask], 1.0, atol=1e-3)
    assert not np.array_equal(
        np.asarray(examples["A"].rollout_entropy), np.asarray(examples["B"].rollout_entropy)
    )
