"""tunix's trainer-side scoring of a rollout's completions, shared by `check` and `compare`.

Owns `trainer_logps` and `trainer_scores` (tunix's `compute_per_token_logps` on a rollout
output, the second with the trainer's logits too; replaying the rollout's experts on a MoE
where asked; in one process, in chunks of rows whose logits fit `SCORING_LOGITS_BYTES`),
`replays` (whether a rollout and trainer can), `floating_dtype` (the dtype of a model's
weights), `before_pad` (where a completion ends for tunix's trainer, which reads a pad id as
padding) and `with_more_padding` (the same rows in another batch layout).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np

from sgl_jax_rollout.rollout_inputs import right_pad_ids
from tunix_adapter.models import vocab_size
from tunix_adapter.process_batch import global_batch, local_rows, widest

# What the trainer's float32 logits over every position of the rows it scores at once may take
# (tunix's `compute_per_token_logps` holds them and their log-softmax): at Gemma 3's 262,144-id
# vocabulary one row of 1,040 tokens is 1.1 GB, so 8 rows would take 8.7.
SCORING_LOGITS_BYTES = 1 << 30
LAYOUT_PAD_COLUMNS = 64  # `with_more_padding`: one more compiled width, as a bucket would add


def trainer_logps(rollout, trainer, out, temperature: float, replay: bool = False) -> np.ndarray:
    """tunix's trainer-side logprobs `[B, L]` of a rollout output's completions at
    `temperature` (`trainer_scores` without the logits, which tunix main would compute in a
    second forward)."""
    return _scores(rollout, trainer, out, temperature, replay, logits=False)[0]


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
    return _scores(rollout, trainer, out, temperature, replay, logits=True)


def _scores(rollout, trainer, out, temperature: float, replay: bool, logits: bool) -> tuple:
    """`trainer_scores`' logprobs, and its logits where `logits`, as this process's rows."""
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
    rows = len(prompts)
    with replayed:
        graphdef, state = nnx.split(trainer)
        if jax.process_count() > 1:  # the trainer's arrays span every host: so does the batch
            mesh = jax.tree_util.tree_leaves(state)[0].sharding.mesh
            prompts, completions = global_batch([prompts, completions], mesh, mesh.axis_names[:1])
        # in one process, chunks of rows whose logits fit (a replayed routing covers them all)
        chunk = len(prompts)
        if jax.process_count() == 1 and not replay:
            itemsize = max(4, floating_dtype(state).itemsize)  # the logits: float32 at least
            row_bytes = (prompts.shape[1] + width) * vocab_size(trainer.config) * itemsize
            chunk = chunk_rows(rows, row_bytes)
        parts = [
            per_token_logps_and_logits(
                graphdef, state, p, c, pad, rollout.eos_id(), temperature, logits=logits
            )[: 2 if logits else 1]  # the logits are None where not asked for
            for p, c in zip(row_chunks(prompts, chunk), row_chunks(completions, chunk), strict=True)
        ]
    if len(parts) == 1:
        return tuple(local_rows(array, rows) for array in parts[0])
    return tuple(
        np.concatenate([np.asarray(part[i]) for part in parts])[:rows] for i in range(len(parts[0]))
    )


def floating_dtype(tree: Any) -> np.dtype:
    """The dtype of `tree`'s first floating leaf (a model's weights: the dtype they are in)."""
    import jax
    import jax.numpy as jnp

    leaves = jax.tree_util.tree_leaves(tree)
    return next(np.dtype(x.dtype) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))


def with_more_padding(out: Any, pad: int, columns: int = LAYOUT_PAD_COLUMNS) -> Any:
    """`out` with `columns` more pad ids left of every prompt: the same tokens at the same
    positions (tunix's trainer numbers positions from the mask) in another batch layout, which
    scored again gives the trainer's own layout spread (`check`'s floor row)."""
    prompts = np.asarray(out.left_padded_prompt_tokens)
    wider = np.pad(prompts, ((0, 0), (columns, 0)), constant_values=pad)
    return dataclasses.replace(out, left_padded_prompt_tokens=wider)


def chunk_rows(rows: int, row_logits_bytes: int) -> int:
    """Rows the trainer scores at once: all of them where their logits over every position
    (`row_logits_bytes` a row) fit `SCORING_LOGITS_BYTES`, else as many as fit (one at least)."""
    return max(1, min(rows, SCORING_LOGITS_BYTES // row_logits_bytes))


def row_chunks(array: Any, chunk: int) -> list[Any]:
    """`array`'s rows in chunks of `chunk`, the last one filled with copies of its last row
    (one shape, so one compiled program); `[array]` itself where one chunk holds it."""
    if chunk >= len(array):
        return [array]
    pad = -len(array) % chunk
    array = np.concatenate([array, np.repeat(array[-1:], pad, axis=0)]) if pad else array
    return [array[i : i + chunk] for i in range(0, len(array), chunk)]


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
