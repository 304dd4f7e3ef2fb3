"""GRPO, EGPO and PPO steps with SglangJaxRollout on the built-in model (engine-marked).

Each test builds its own cluster and engine and shuts the engine down (one engine per
process), before the session rollout starts (tests/conftest.py).
"""

import jax
import numpy as np
import pytest

from sgl_jax_rollout_apps import demo
from tests.tunix_adapter.training_helpers import (
    changed,
    check_example,
    train_and_capture,
)
from tests.tunix_adapter.training_helpers import engine_config as config

pytestmark = pytest.mark.engine

PROMPTS = ["Tell me about the water:", "Tell me about the plan:"]


def greedy_probe(cluster) -> dict:
    """The engine's greedy tokens, and the actor's argmax at each of those positions."""
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout import tunix_compat
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    rc = RolloutConfig(max_tokens_to_generate=12, max_prompt_length=16, temperature=0.0)
    out = cluster.rollout.generate(PROMPTS, rc)
    pad, eos = cluster.rollout.pad_id(), cluster.rollout.eos_id()
    width = max(len(t) for t in out.tokens)
    completions = np.full((len(PROMPTS), width), pad, np.int32)
    for i, t in enumerate(out.tokens):
        completions[i, : len(t)] = t
    graphdef, state = nnx.split(cluster.actor_trainer.model)
    _, logits = tunix_compat.per_token_logps_and_logits(
        graphdef,
        state,
        jnp.asarray(out.left_padded_prompt_tokens),
        jnp.asarray(completions),
        pad,
        eos,
        1.0,
    )
    argmax = np.asarray(logits).argmax(-1)
    return {
        "tokens": [t.tolist() for t in out.tokens],
        "actor_argmax": [argmax[i, : len(t)].tolist() for i, t in enumerate(out.tokens)],
    }


@pytest.mark.parametrize(("algo", "steps"), [("grpo", 2), ("egpo", 1)])
def test_grpo_and_egpo_steps_train_on_rollout_logprobs_and_sync_the_engine(tiny_dir, algo, steps):
    cfg = config(tiny_dir, algo=algo, steps=steps)
    history, examples, before, after, cluster, (first, last) = train_and_capture(
        cfg, probe=greedy_probe
    )
    assert len(history) == len(examples) == steps
    for example in examples:
        check_example(example, cfg, cluster.rollout.pad_id())
    assert changed(before, after)
    # The rollout's logprobs are the trainer's on the same weights, at every step: the
    # weights were synced to the engine after each step.
    assert history[0]["logp_diff_max"] < 1e-4, history[0]
    assert all(row["logp_diff_max"] < 1e-4 for row in history), history
    # ... with the engine's KV pool released for every trainer update (the default where
    # the rollout shares the actor's devices) and taken back by the next rollout.
    assert all(row["memory_released_bytes"] > 0 for row in history), history
    # After training the engine serves the trained weights: greedy outputs changed, and they
    # are the trained actor's own argmax.
    assert last["tokens"] != first["tokens"]
    assert last["tokens"] == last["actor_argmax"]


def test_weights_released_between_mini_batches_come_back_as_the_last_synced_ones(tiny_dir):
    """Two mini-batches a step with the engine's weights released for each trainer update:
    the second mini-batch's rollout runs before the step's sync, so the engine serves the
    weights of the last sync again (tunix's anchor state) instead of failing or sampling with
    others. Its logprobs equal the trainer's under the anchor weights at every step."""
    # tunix counts optimizer updates as steps: 4 of them are 2 steps of 2 mini-batches
    cfg = config(tiny_dir, algo="grpo", steps=4, mini_batch_size=2, release_memory="weights")

    def weight_bytes(cluster) -> int:
        return sum(
            x.nbytes for x in jax.tree_util.tree_leaves(cluster.rollout.engine.engine_state())
        )

    history, examples, before, after, _, (weights, _) = train_and_capture(cfg, weight_bytes)
    assert len(history) == 2 and len(examples) == 4  # two mini-batches a step
    assert changed(before, after)
    assert all(row["logp_diff_max"] < 1e-4 for row in history), history
    assert all(row["memory_released_bytes"] > weights for row in history), history


def test_ppo_step_runs_with_rollout_scoring_as_old_logprobs(tiny_dir):
    cfg = config(tiny_dir, algo="ppo", steps=1)
    history, examples, before, after, cluster = train_and_capture(cfg)
    assert len(history) == 1
    example = examples[0]
    mask = np.asarray(example.completion_mask)
    old = np.asarray(example.old_per_token_logps)
    assert old.shape == mask.shape and np.all(old[mask] <= 0) and np.isfinite(old[mask]).all()
    assert changed(before, after)
    assert 0 < history[0]["entropy_mean"] < np.log(1024)


def test_twenty_demo_steps_raise_the_mean_reward(tiny_dir, tmp_path):
    history = demo.run(config(tiny_dir, algo="grpo", steps=20, out=str(tmp_path)))
    rewards = [row["reward_mean"] for row in history]
    assert len(rewards) == 20
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.05, rewards
    assert (tmp_path / "metrics.png").is_file()
    # Nothing compiles after the warm-up step: neither the engine's sampler nor the trainer.
    assert history[0]["compiles"] > 0  # the counter sees the trainer's first-step compiles
    assert [row["compiles_after_warmup"] for row in history] == [0] * 20


def test_lora_grpo_steps_serve_the_adapters(tiny_dir):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout import tunix_compat
    from tunix_adapter.models import load_tunix_model

    cfg = config(tiny_dir, algo="grpo", steps=3, lora_rank=8, lora_alpha=32.0, learning_rate=3e-2)
    history, _, before, after, cluster, (_, last) = train_and_capture(cfg, probe=greedy_probe)
    named = {
        jax.tree_util.keystr(path): (old, new)
        for (path, old), new in zip(
            jax.tree_util.tree_flatten_with_path(before)[0],
            jax.tree_util.tree_leaves(after),
            strict=True,
        )
    }
    adapters = {k: v for k, v in named.items() if "_lora_" in k}
    assert adapters and all(
        np.abs(new).max() > 0 for k, (_, new) in adapters.items() if "lora_b" in k
    )
    # tunix trains only the adapters; the base stays frozen.
    assert all(np.array_equal(old, new) for k, (old, new) in named.items() if "_lora_" not in k)
    # Every step's rollout logprobs are the LoRA trainer's: the engine served base and adapters.
    assert all(row["logp_diff_max"] < 1e-4 for row in history), history
    assert last["tokens"] == last["actor_argmax"]
    # The check above can fail: the trained adapters move the logprobs well past 1e-4.
    pad, eos = cluster.rollout.pad_id(), cluster.rollout.eos_id()
    width = max(len(t) for t in last["tokens"])
    completions = np.full((len(PROMPTS), width), pad, np.int32)
    for i, t in enumerate(last["tokens"]):
        completions[i, : len(t)] = t
    prompts = jnp.full((len(PROMPTS), 4), 7, jnp.int32)

    def logps(model):
        graphdef, state = nnx.split(model)
        return np.asarray(
            tunix_compat.compute_per_token_logps(
                graphdef, state, prompts, jnp.asarray(completions), pad, eos, stop_gradient=True
            )
        )

    gap = np.abs(logps(cluster.actor_trainer.model) - logps(load_tunix_model(tiny_dir))).max()
    assert gap > 1e-2, gap
