"""SglangJaxRollout built by tunix's own cluster from `functools.partial`, as users wire it.

Engine-marked. It starts its own engine, so it runs once the session rollout is shut down
(`after_session_engine`, tests/conftest.py; one engine per process); alone, it runs by itself.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.after_session_engine]


def test_cluster_builds_generates_and_syncs_weights_through_our_rollout(tiny_dir):
    from flax import nnx
    from transformers import AutoTokenizer

    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.rollout import RolloutOutputWithEntropy, SglangJaxRollout
    from sgl_jax_rollout.tunix_compat import (
        ClusterConfig,
        RLCluster,
        RLTrainingConfig,
        Role,
        RolloutConfig,
    )
    from tests.conftest import small_engine_settings
    from tunix_adapter.models import load_tunix_model

    if patches.current() is not None:
        pytest.skip("another engine is still running in this process")
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"))
    actor = load_tunix_model(tiny_dir)
    config = ClusterConfig(
        role_to_mesh={Role.ACTOR: mesh, Role.REFERENCE: mesh, Role.ROLLOUT: mesh},
        rollout_engine=functools.partial(
            SglangJaxRollout, model_path=tiny_dir, engine_settings=small_engine_settings()
        ),
        training_config=RLTrainingConfig(
            actor_optimizer=optax.sgd(1e-3), eval_every_n_steps=1, max_steps=1
        ),
        rollout_config=RolloutConfig(
            max_tokens_to_generate=8, max_prompt_length=16, temperature=0.0, seed=0
        ),
    )
    cluster = RLCluster(
        actor=actor,
        reference=load_tunix_model(tiny_dir),
        tokenizer=AutoTokenizer.from_pretrained(tiny_dir),
        cluster_config=config,
    )
    try:
        assert isinstance(cluster.rollout, SglangJaxRollout)
        before = cluster.generate(["hello there", "one two"])
        # tunix 0.1.7's cluster rebuilds a plain RolloutOutput (entropy is carried to training
        # by tunix_adapter); the rollout itself returns it.
        direct = cluster.rollout.generate(["hello there"], config.rollout_config)
        assert isinstance(direct, RolloutOutputWithEntropy)
        assert len(direct.entropy[0]) == len(direct.tokens[0]) == len(before.tokens[0])
        params = nnx.state(cluster.actor_trainer.model, nnx.Param)
        nnx.update(cluster.actor_trainer.model, jax.tree_util.tree_map(lambda x: x * 1.5, params))
        cluster.sync_weights()  # under tunix's CPU transfer guard
        after = cluster.generate(["hello there", "one two"])
        changed = [
            not np.array_equal(a, b) for a, b in zip(after.tokens, before.tokens, strict=True)
        ]
        assert any(changed)
    finally:
        cluster.rollout.shutdown()
