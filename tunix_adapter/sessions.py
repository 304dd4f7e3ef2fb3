"""Managed-session trajectories as tunix training input.

Owns the export of `Session.trajectories()` (sgl_jax_rollout/session.py) to the two inputs
the trainer side consumes:

- `agentic_item`: a tunix 0.1.7 `TrajectoryItem` whose `traj` is the dict that tunix's own
  trajectory collector builds in "Token" mode and its agentic GRPO learner reads
  (`prompt_tokens`, `conversation_tokens`, `conversation_masks`, `old_logprobs`, ...). Our
  entropy rides along as `rollout_entropy`.
- `grpo_batch`: padded arrays for our GRPO path (`RolloutTrainExample`'s fields): left-padded
  prompts, right-padded conversations, the assistant mask as completion mask, and
  `rollout_logprobs` / `rollout_entropy` with 0.0 outside it; for a MoE whose session returned
  its routing, `routed_experts` in the trainer's input layout (`routing_replay.input_routing`:
  -1 at every pad), for routing replay.

The split is the same in both: the prompt is everything before the first sampled token; the
"completion" is every later token, sampled (mask 1) or environment (mask 0). Padding uses
tunix's own agentic helpers, so both inputs pad exactly as tunix's learner does. docs/design.md
section 4's session fills (1.0 logprob at environment positions) become tunix's (0.0).
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int

from sgl_jax_rollout.tunix_compat import TrajectoryItem, left_pad, right_pad
from tunix_adapter.routing_replay import input_routing

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Split:
    prompt: Int[np.ndarray, " p"]
    tokens: Int[np.ndarray, " c"]
    mask: Int[np.ndarray, " c"]
    logprobs: Float[np.ndarray, " c"]
    entropy: Float[np.ndarray, " c"]
    prompt_routing: Int[np.ndarray, "p layers k"] | None = None
    routing: Int[np.ndarray, "c layers k"] | None = None


def _split(trajectory: Mapping[str, Sequence], index: int) -> _Split:
    fields = ("token_ids", "assistant_mask", "logprobs", "entropy")
    missing = [f for f in fields if f not in trajectory]
    if missing:
        raise ValueError(
            f"trajectories[{index}] lacks {missing}; pass the dicts of Session.trajectories()"
        )
    tokens = np.asarray(trajectory["token_ids"], dtype=np.int32)
    mask = np.asarray(trajectory["assistant_mask"], dtype=bool)
    logprobs = np.asarray(trajectory["logprobs"], dtype=np.float32)
    entropy = np.asarray(trajectory["entropy"], dtype=np.float32)
    lengths = {len(tokens), len(mask), len(logprobs), len(entropy)}
    if len(lengths) != 1:
        raise ValueError(
            f"trajectories[{index}]: token_ids, assistant_mask, logprobs and entropy must have "
            f"one length, got {len(tokens)}, {len(mask)}, {len(logprobs)}, {len(entropy)}"
        )
    if not mask.any():
        raise ValueError(f"trajectories[{index}] has no sampled token; nothing to train on")
    start = int(np.argmax(mask))
    rest = slice(start, None)
    routing = trajectory.get("routed_experts")
    if routing is not None:
        routing = np.asarray(routing, np.int32)
        if routing.ndim != 3 or len(routing) != len(tokens):
            raise ValueError(
                f"trajectories[{index}]: routed_experts must be [len(token_ids), layers, top_k] "
                f"= [{len(tokens)}, ...], got shape {routing.shape}"
            )
    return _Split(
        prompt=tokens[:start],
        tokens=tokens[rest],
        mask=mask[rest].astype(np.int32),
        logprobs=np.where(mask[rest], logprobs[rest], 0.0).astype(np.float32),
        entropy=np.where(mask[rest], entropy[rest], 0.0).astype(np.float32),
        prompt_routing=None if routing is None else routing[:start],
        routing=None if routing is None else routing[rest],
    )


def agentic_item(
    trajectory: Mapping[str, Sequence],
    *,
    reward: float,
    policy_version: int,
    group_id: Hashable,
    pair_index: int,
    original_input: Mapping[str, Any] | None = None,
    conversation_text: Sequence[Mapping[str, str]] = (),
) -> TrajectoryItem:
    """One session trajectory as the `TrajectoryItem` tunix's agentic GRPO learner reads.

    `conversation_text` is the chat messages (tunix's learner hands the first assistant
    message to reward functions); `original_input` is the dataset row (reward kwargs).
    """
    split = _split(trajectory, pair_index)
    traj = {
        "conversation_text": list(conversation_text),
        "prompt_tokens": split.prompt,
        "conversation_tokens": split.tokens,
        "conversation_masks": split.mask,
        "old_logprobs": split.logprobs,
        "rollout_entropy": split.entropy,
        "trajectory_reward": float(reward),
        "policy_version": policy_version,
        "original_input": dict(original_input or {}),
        "group_id": group_id,
        "status": "DONE",
    }
    return TrajectoryItem(pair_index=pair_index, group_id=group_id, start_step=0, traj=traj)


@dataclasses.dataclass(frozen=True)
class SessionBatch:
    """Padded session trajectories, laid out like `RolloutTrainExample`'s token fields."""

    prompt_ids: Int[np.ndarray, "b p"]
    prompt_mask: Bool[np.ndarray, "b p"]
    completion_ids: Int[np.ndarray, "b c"]
    completion_mask: Int[np.ndarray, "b c"]
    rollout_logprobs: Float[np.ndarray, "b c"]
    rollout_entropy: Float[np.ndarray, "b c"]
    routed_experts: Int[np.ndarray, "b p_c layers k"] | None = None  # -1 at pads


def grpo_batch(
    trajectories: Sequence[Mapping[str, Sequence]],
    *,
    pad_id: int,
    max_prompt_length: int,
    max_response_length: int,
) -> SessionBatch:
    """Pads session trajectories the way tunix's agentic learner does (prompts cut from the
    left, conversations from the right, each with a warning naming the tokens dropped).

    Raises when a trajectory holds `pad_id` at a real position: tunix's trainer reads every
    pad as padding, so that token would be scored on another context than it was sampled on.
    """
    if max_prompt_length < 1 or max_response_length < 1:
        raise ValueError(
            f"max_prompt_length and max_response_length must be >= 1, got "
            f"{max_prompt_length} and {max_response_length}"
        )
    rows = []
    for i, trajectory in enumerate(trajectories):
        split = _split(trajectory, i)
        for name, ids in (("prompt", split.prompt), ("conversation", split.tokens)):
            if np.any(ids == pad_id):
                where = int(np.argmax(ids == pad_id))
                raise ValueError(
                    f"trajectories[{i}]: {name} token {where} is the pad id {pad_id}; tunix's "
                    "trainer would read it as padding"
                )
        if len(split.prompt) > max_prompt_length:
            log.warning(
                "trajectories[%d]: prompt has %d tokens, max_prompt_length %d: the first %d "
                "are dropped",
                i,
                len(split.prompt),
                max_prompt_length,
                len(split.prompt) - max_prompt_length,
            )
        if len(split.tokens) > max_response_length:
            log.warning(
                "trajectories[%d]: conversation has %d tokens, max_response_length %d: the last "
                "%d are dropped",
                i,
                len(split.tokens),
                max_response_length,
                len(split.tokens) - max_response_length,
            )
        rows.append(split)
    if not rows:
        raise ValueError("trajectories is empty")

    def right(values: np.ndarray, pad: float, dtype: Any) -> np.ndarray:
        return right_pad(values, max_response_length, pad, dtype=dtype)

    prompt_ids = np.stack([left_pad(r.prompt, max_prompt_length, pad_id) for r in rows])
    routed = [r.routing is not None for r in rows]
    if any(routed) and not all(routed):
        raise ValueError(
            f"trajectories {[i for i, x in enumerate(routed) if not x]} carry no routed_experts "
            "while others do: export one model's sessions together"
        )
    routing = None
    if all(routed):
        routing = input_routing(
            types.SimpleNamespace(
                routed_experts=[r.routing for r in rows],
                prompt_routed_experts=[r.prompt_routing for r in rows],
            ),
            max_prompt_length,
            max_response_length,
        )
    return SessionBatch(
        routed_experts=routing,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_ids != pad_id,
        completion_ids=np.stack([right(r.tokens, pad_id, np.int32) for r in rows]),
        completion_mask=np.stack([right(r.mask, 0, np.int32) for r in rows]),
        rollout_logprobs=np.stack([right(r.logprobs, 0.0, np.float32) for r in rows]),
        rollout_entropy=np.stack([right(r.entropy, 0.0, np.float32) for r in rows]),
    )
