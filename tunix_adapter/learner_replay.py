"""Routing replay in a learner: what `RolloutGRPOLearner` does with a MoE rollout's experts.

Owns the learner's uses of `routing_replay.py`: the loss wrapped to route with the example's
`routed_experts` (`replay_in_loss`), the last rollout's routing in the trainer's input layout
(`rollout_routing`), the trainer's logprobs of the sampled tokens routed as the rollout routed
them (`replayed_scores`) and `rollout/routing_mismatch_frac` (`routing_metrics`). It keeps no
batch: the learner holds each batch's routing and passes it in.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tunix_adapter import metrics, routing_replay
from tunix_adapter.rollout_cluster import RolloutCluster


def replay_in_loss(trainer) -> None:
    """Wraps tunix's loss (set by `GRPOLearner.__init__`) so that its forward routes with
    the example's `routed_experts` (`routing_replay.replaying`, inside the trace)."""
    if jax.process_count() > 1:
        raise ValueError(
            "routing_replay runs in one JAX process: its trainer scoring does not yet gather "
            f"every host's rows (this run has {jax.process_count()} processes)"
        )
    routing_replay.enable(trainer.model)
    loss_fn = trainer.loss_fn

    @functools.wraps(loss_fn)  # nnx.grad maps tunix's keyword inputs by its signature
    def replayed_loss(model, train_example, *args, **kwargs):
        with routing_replay.replaying(model, train_example.routed_experts):
            return loss_fn(model, train_example, *args, **kwargs)

    trainer.with_loss_fn(replayed_loss, has_aux=True)


def rollout_routing(
    cluster: RolloutCluster, required: bool, prompt_width: int, width: int
) -> np.ndarray | None:
    """The last rollout's routed experts in the trainer's input layout, None where the
    rollout returned none (a dense model); ValueError where `required` (routing replay)
    then."""
    out = cluster.batch_rollout
    if getattr(out, "routed_experts", None) is None and not required:
        return None
    return routing_replay.input_routing(out, prompt_width, width)  # raises without them


def routing_metrics(
    cluster: RolloutCluster, routing: np.ndarray, prompt_ids, completion_ids, temperature: float
) -> metrics.Metrics:
    """`rollout/routing_mismatch_frac` (overall and per layer): the share of the batch's
    input positions whose experts the trainer, routing itself, would choose otherwise."""
    _, used = routing_replay.routing_and_logps(
        cluster.actor_trainer.model,
        jnp.asarray(prompt_ids),
        jnp.asarray(completion_ids),
        None,
        pad_id=cluster.rollout.pad_id(),
        eos_id=cluster.rollout.eos_id(),
        temperature=temperature,
    )
    frac = routing_replay.mismatch_frac(routing, np.asarray(used), routing[..., 0, 0] >= 0)
    return metrics.routing_metrics(frac)


def replayed_scores(
    cluster: RolloutCluster, routing: np.ndarray, prompt_ids, completion_ids, temperature: float
) -> np.ndarray:
    """The trainer's logprobs of the sampled tokens routed as the rollout routed them,
    under the weights that sampled them (the anchor state, as tunix scores)."""
    logps, _ = routing_replay.routing_and_logps(
        cluster.anchor_model(),
        jnp.asarray(prompt_ids),
        jnp.asarray(completion_ids),
        jnp.asarray(routing),
        pad_id=cluster.rollout.pad_id(),
        eos_id=cluster.rollout.eos_id(),
        temperature=temperature,
    )
    return np.asarray(logps, np.float32)
