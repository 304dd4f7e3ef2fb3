"""GRPO steps with DAPO's filter, over-sampling and partial rollouts on SglangJaxRollout
(engine-marked).

The test builds its own cluster and engine and shuts the engine down (one engine per
process), before the session rollout starts (tests/conftest.py).
"""

import dataclasses

import numpy as np
import pytest

from sgl_jax_rollout.rollout_inputs import right_pad_values
from sgl_jax_rollout_apps import demo
from tests.conftest import small_engine_settings
from tests.tunix_adapter.training_helpers import engine_config

pytestmark = pytest.mark.engine

# Prompts about these subjects score 1.0 whatever the completion: their groups carry no GRPO
# signal and the filter must drop them.
CONSTANT = {"water", "time", "people", "world", "way", "day", "life", "work"}


def reward(prompts, completions, **_):
    out = []
    for prompt, text in zip(prompts, completions, strict=True):
        if prompt.split("the ")[-1].rstrip(":") in CONSTANT:
            out.append(1.0)
        else:  # the demo's dense reward, plus the length so that samples differ
            out.append(len(text) / 100.0)
    return out


def test_grpo_steps_with_filter_over_sampling_and_partial_rollouts(tiny_dir, monkeypatch):
    import tunix_adapter.rewards

    monkeypatch.setattr(tunix_adapter.rewards, "vowel_word_reward", reward)
    n, steps = 4, 3
    cfg = engine_config(
        tiny_dir,
        steps=steps,
        prompts_per_step=2,
        num_generations=n,
        filter_groups="verl",
        over_sampling_batch_size=4,
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=True,
    )
    # 5 rows at a time: groups finish in waves, so the groups a step does not need have
    # samples finished under one policy version and samples left for the next
    cfg = dataclasses.replace(cfg, engine_settings=small_engine_settings(max_running_requests=5))
    cluster, learner = demo.build(cfg)
    captured = []
    produce = learner._generate_and_compute_advantage

    def capturing(*args, **kwargs):
        example = produce(*args, **kwargs)
        out = cluster.batch_rollout
        captured.append((example, out, cluster.rollout.policy_version))
        return example

    learner._generate_and_compute_advantage = capturing
    history = demo.train(cfg, cluster, learner)
    assert len(history) == len(captured) == steps

    filtered = sum(row["dynamic_sampling/groups_filtered"] for row in history)
    assert filtered > 0, history  # constant-reward groups were sampled and dropped
    stale_tokens = 0
    for (example, out, version), row in zip(captured, history, strict=True):
        assert row["dynamic_sampling/groups_kept"] == cfg.prompts_per_step
        assert row["dynamic_sampling/num_gen_batches"] >= 1
        advantages = np.asarray(example.advantages).reshape(-1, n)
        # every kept group has rewards that differ (a constant group's advantages are all 0)
        assert np.all(np.abs(advantages).max(axis=1) > 0), advantages
        assert all(text for text in out.text)
        # old policy = the rollout's logprobs, each under the version that sampled its token
        np.testing.assert_array_equal(
            np.asarray(example.old_per_token_logps), np.asarray(example.rollout_logprobs)
        )
        ids = np.asarray(example.completion_ids)
        sampled = ids != cluster.rollout.pad_id()
        versions = right_pad_values(out.versions, ids.shape[1]).astype(int)
        stale = sampled & (versions < version)
        mask = np.asarray(example.completion_mask).astype(bool)
        # slime's --mask-offpolicy-in-partial-rollout: older versions' tokens leave the loss
        np.testing.assert_array_equal(mask, sampled & ~stale)
        stale_tokens += int(stale.sum())
        assert row["partial_rollout/offpolicy_token_frac"] == pytest.approx(
            stale.sum() / sampled.sum()
        )
        # tokens of the current version: rollout and trainer agree (float32)
        if (sampled & ~stale).any():
            assert row["partial_rollout/current_logp_abs_diff_max"] < 1e-4, row
    assert stale_tokens > 0  # a paused group came back under newer weights
    versions = [version for _, _, version in captured]
    assert versions == sorted(set(versions))  # a weight sync between steps
