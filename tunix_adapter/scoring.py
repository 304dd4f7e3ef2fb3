"""tunix's trainer-side scoring of a rollout's completions, shared by `check` and `compare`.

Owns `trainer_scores` (tunix's `compute_per_token_logps` on a rollout output, replaying the
rollout's experts on a MoE where asked), `replays` (whether a rollout and trainer can) and
`before_pad` (where a completion ends for tunix's trainer, which reads a pad id as padding).
"""

from __future__ import annotations

import contextlib

import numpy as np

from sgl_jax_rollout.rollout_inputs import right_pad_ids
from tunix_adapter.process_batch import global_batch, local_rows, widest


def trainer_scores(
    rollout, trainer, out, temperature: float, replay: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """tunix's trainer-side logprobs `[B, L]` of a rollout output's completions at
    `temperature`, and the trainer's logits `[B, L, V]` at those positions. `replay`: the
    trainer's MoE layers route every position as the rollout did (`out.routed_experts`,
    `routing_replay`), as training with `routing_replay=True` scores it.

    With one JAX process per host, `out` is this process's share: the trainer scores every
    process's share at once (its arrays span every host) and this process gets its rows back.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout.tunix_compat import per_token_logps_and_logits
    from tunix_adapter import routing_replay

    pad = rollout.pad_id()
    width = widest(max(1, max(len(t) for t in out.tokens)))
    completions = right_pad_ids(out.tokens, width, pad)
    prompts = np.asarray(out.left_padded_prompt_tokens)
    replayed = contextlib.nullcontext()
    if replay:
        if jax.process_count() > 1:
            raise ValueError(
                "scoring a MoE with the rollout's experts (routing replay; `check` does it for "
                f"every MoE) runs in one JAX process only, not {jax.process_count()}"
            )
        routing = routing_replay.input_routing(out, prompts.shape[1], width)
        replayed = routing_replay.replaying(trainer, jnp.asarray(routing))
    with replayed:
        graphdef, state = nnx.split(trainer)
        if jax.process_count() > 1:  # the trainer's arrays span every host: so does the batch
            mesh = jax.tree_util.tree_leaves(state)[0].sharding.mesh
            prompts, completions = global_batch([prompts, completions], mesh, mesh.axis_names[:1])
        logps, logits = per_token_logps_and_logits(
            graphdef, state, prompts, completions, pad, rollout.eos_id(), temperature
        )
    rows = len(out.tokens)
    return local_rows(logps, rows), local_rows(logits, rows)


def replays(rollout, trainer) -> bool:
    """Whether `trainer_scores` can replay: a MoE trainer (its replay slots given here) and an
    engine returning routed experts."""
    from tunix_adapter import routing_replay

    if not (rollout.engine.settings.return_routed_experts and routing_replay.moe_layers(trainer)):
        return False
    routing_replay.enable(trainer)
    return True


def before_pad(tokens, pad: int) -> int:
    """Index of the first pad id in `tokens` (its length when there is none)."""
    hits = np.flatnonzero(np.asarray(tokens) == pad)
    return int(hits[0]) if hits.size else len(tokens)
