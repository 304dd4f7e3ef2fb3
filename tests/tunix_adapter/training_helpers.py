"""Shared by the training tests: run the demo's learner for a few steps and keep what it made."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from sgl_jax_rollout_apps import demo
from tests.conftest import small_engine_settings


def engine_config(tiny_dir, **kwargs) -> demo.DemoConfig:
    """The demo's config on our rollout, the built-in model and the tests' engine settings."""
    return demo.DemoConfig(
        rollout="sglang_jax",
        model_path=str(tiny_dir),
        engine_settings=small_engine_settings(),
        show_progress=False,
        **kwargs,
    )


def train_and_capture(config: demo.DemoConfig, probe=None):
    """(history, training examples, actor params before, actor params after, cluster), and
    with `probe`, also (probe(cluster) before training, probe(cluster) after training).

    Params are copied to the host (`np.array`): a zero-copy view would follow donated buffers.
    """
    cluster, learner = demo.build(config)
    examples = []
    produce = learner._generate_and_compute_advantage

    def capturing(*args, **kwargs):
        example = produce(*args, **kwargs)
        examples.append(example)
        return example

    learner._generate_and_compute_advantage = capturing
    before = jax.tree_util.tree_map(np.array, nnx.state(cluster.actor_trainer.model, nnx.Param))
    probed = [probe(cluster)] if probe else []
    history = demo.train(config, cluster, learner, shutdown=probe is None)
    after = jax.tree_util.tree_map(np.array, nnx.state(cluster.actor_trainer.model, nnx.Param))
    if probe:
        try:
            probed.append(probe(cluster))
        finally:
            cluster.rollout.shutdown()
        return history, examples, before, after, cluster, probed
    return history, examples, before, after, cluster


def changed(before, after) -> bool:
    pairs = zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=True)
    return any(not np.array_equal(a, b) for a, b in pairs)


def check_example(example, config: demo.DemoConfig, pad_id: int) -> None:
    """Fields, shapes and masks of one training example, as docs/design.md section 4 fixes them."""
    rows = config.prompts_per_step * config.num_generations
    shape = (rows, config.max_tokens)
    ids = np.asarray(example.completion_ids)
    mask = np.asarray(example.completion_mask)
    assert ids.shape == mask.shape == shape
    np.testing.assert_array_equal(mask, ids != pad_id)
    for name in ("rollout_logprobs", "rollout_entropy"):
        values = np.asarray(getattr(example, name))
        assert values.shape == shape and values.dtype == np.float32, name
        assert np.all(values[~mask] == 0.0), f"{name} must be 0.0 outside the completion mask"
    entropy = np.asarray(example.rollout_entropy)[mask]
    assert np.all(entropy >= 0) and np.all(entropy <= np.log(1024) + 1e-4)
    assert entropy.std() > 0  # the tiny model's distributions have varied entropy
    logprobs = np.asarray(example.rollout_logprobs)[mask]
    assert np.all(logprobs <= 0) and np.all(np.isfinite(logprobs))
    if config.tis_cap is None:
        # rollout logprobs are the old policy's logprobs (no trainer recomputation)
        np.testing.assert_array_equal(
            np.asarray(example.old_per_token_logps), np.asarray(example.rollout_logprobs)
        )
        assert example.sampler_is_weights is None
    else:  # the old policy is the trainer's; TIS weights correct the rollout mismatch
        old = example.old_per_token_logps
        # tunix 0.1.7 leaves the old logprobs to the loss (one iteration: the current policy);
        # tunix main scores them with the trainer under use_rollout_logps=False
        if old is not None:
            old = np.asarray(old)
            assert old.shape == shape and np.all(np.isfinite(old)) and np.all(old[mask] <= 0)
        weights = np.asarray(example.sampler_is_weights)
        assert weights.shape == shape and np.all(weights[~mask] == 0)
        assert np.all((weights[mask] > 0) & (weights[mask] <= config.tis_cap))
    assert np.asarray(example.advantages).shape == (rows,)
