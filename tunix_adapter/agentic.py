"""tunix's agentic learner (`AgenticGRPOLearner`, `tunix/rl/agentic/`) on our rollout.

Owns `serve_agentic`, which puts `AgenticModelCall` in place of a built learner's model call,
`ScalarTaskEnvironment` / `ScalarToolEnvironment` (tunix's single-turn and tool-calling
environments, their fields unwrapped) and `ToolPromptChatParser` (tunix's Qwen chat parser,
the tool-call tags of system and assistant messages intact). With `ToolAgent` and
`ScalarToolEnvironment` an episode is multi-turn: a tool's output comes back as a `tool`
message, which tunix trains as prompt tokens (masked) and the next turn here is sampled from,
token in. tunix's orchestrator runs up to `max_concurrency` episodes at once, each calling the
model with one chat at a time from a thread pool; our engine batches those calls
(`engine.call_gate`). What the model call changes, each for a named tunix fault:

- **Token in, token out** (`token_in=True`, the default). tunix trains an episode as its first
  prompt's ids, then each turn's sampled tokens and the environment's messages tokenized by
  its chat parser (`trajectory_collect_engine.py:606-624` at 0.1.7), but asks the model for
  the next turn with the whole chat rendered to text again (`agentic_rl_learner.py:438-443`),
  which the rollout encodes anew: where the sampled tokens are not what their text encodes
  to, the engine conditioned on another sequence than the trainer scores (0.13 nats at worst
  on the built-in model). Here every turn after the first is sampled from the ids tunix will
  train on: the last prompt, the tokens sampled, and the environment's tokens made by the
  same `tokenize_and_generate_masks` call tunix makes (`SglangJaxRollout.generate_from_ids`).
- **Seeds per episode.** Every call is one prompt, so an int `RolloutConfig.seed` would give
  every call the same stream (row 0), and every member of a GRPO group the same completion:
  each call gets its own seed, derived from (seed, group id, pair index, turn). `None` keeps
  fresh seeds.
- **A sampled pad ends the turn before it.** The rollout ends a completion at a sampled pad id
  and keeps it as its last token (tunix's trainer reads it as padding); an episode's next
  prompt must not hold it, so a turn's output here ends before it, as a session's turn does.
- **A turn that fills the response budget** is dropped by tunix 0.1.7 before the agent records
  it (`trajectory_collect_engine.py:535-537`: no tokens, no logprobs, the reward scored on "";
  tunix main keeps it): under 0.1.7 each call asks for one token less than the budget left
  (`tunix_compat.agentic_keeps_full_turn`).

- **The version that sampled.** tunix stamps an episode with the learner's policy version when
  its model call starts (`agentic_rl_learner.py:435`); a call that arrives while weights sync
  waits for the sync (`engine.call_gate`) and samples under the new weights. Here the stamp is
  the version that sampled, in the learner's numbering, the oldest of the episode's turns: what
  its staleness filter (`_filter_outdated_offpolicy_examples`) and metrics should read.
- **A waiting sync goes first.** tunix's lock held new episodes back while a weight sync waited,
  by blocking its event loop, which can hang `train()`; `serve_agentic` installs a lock that
  does not (`tunix_adapter/rollout_sync_lock.py`), and an episode gives its place up to a
  waiting sync here, on the executor thread, before its first turn. Later turns do not yield:
  an episode is sampled under one weight version.

It calls the rollout itself, as tunix's `_model_call` calls `rl_cluster.generate`
(`agentic_rl_learner.py:428-462`); not through the cluster, so tunix's rollout perf spans and
its CPU offload of the rollout model (`offload_to_cpu`) are not applied. Must not change what
tunix trains: only what the engine is asked, and the version stamp.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

import numpy as np

from sgl_jax_rollout import tunix_compat
from sgl_jax_rollout.rollout_inputs import MAX_SEED, prompt_rows
from tunix_adapter.rollout_sync_lock import LoopSafeRolloutSyncLock


@dataclasses.dataclass
class _Episode:
    ids: list[int] = dataclasses.field(default_factory=list)  # last prompt + tokens sampled
    turns: int = 0
    oldest_version: int | None = None  # the learner's numbering


class AgenticModelCall:
    """A learner's model call (`_model_call(chat_lists, env, max_generation_steps)`) on our
    rollout; `serve_agentic` installs it. `turn_tokens`: at most this many new tokens a turn
    (default: what is left of the episode's `max_response_length`, tunix's only limit).

    On a rollout that takes no token ids and reports no weight versions (tunix's
    `VanillaRollout`, for comparisons) it needs `token_in=False`: every call is the chat as
    text, with its own seed, and an episode is stamped with the learner's version when its
    call starts, as tunix stamps it."""

    def __init__(
        self, learner: Any, cluster: Any, token_in: bool = True, turn_tokens: int | None = None
    ) -> None:
        if turn_tokens is not None and (
            isinstance(turn_tokens, bool) or not isinstance(turn_tokens, int) or turn_tokens < 1
        ):
            raise ValueError(f"turn_tokens must be None or an integer >= 1, got {turn_tokens!r}")
        if learner.chat_parser is None:
            raise ValueError(
                "the agentic learner needs a chat_parser (e.g. QwenChatTemplateParser): without "
                "one tunix records no assistant tokens (trajectory_collect_engine.py:611)"
            )
        self._learner = learner
        self._cluster = cluster
        self.token_in = token_in
        self.turn_tokens = turn_tokens
        self._keeps_full_turn = tunix_compat.agentic_keeps_full_turn()
        self._ours = hasattr(cluster.rollout, "generate_from_ids")  # our SglangJaxRollout
        if token_in and not self._ours:
            raise ValueError(
                f"token_in=True needs a rollout that takes token ids (SglangJaxRollout."
                f"generate_from_ids); {type(cluster.rollout).__name__} has none: token_in=False"
            )
        # engine weight version - learner policy version (the rollout's own start counts one)
        self._version_offset = (
            cluster.rollout.policy_version - learner.policy_version if self._ours else 0
        )
        self._episodes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # episodes are looked up from many threads

    def __call__(
        self, chat_lists: list[dict[str, str]], env: Any = None, max_generation_steps: Any = None
    ) -> Any:
        learner = self._learner
        episode = self._episode(env)
        if env is not None and not episode.turns:  # a waiting sync goes first (its module says why)
            learner._rollout_sync_lock.yield_to_waiting_sync()
        config = self._cluster.get_rollout_config(tunix_compat.Mode.TRAIN)
        limit = max_generation_steps or config.max_tokens_to_generate
        if not self._keeps_full_turn and limit > 1:
            limit -= 1
        limit = min(limit, self.turn_tokens or limit)
        seed = _call_seed(config.seed, env, episode.turns)
        if seed is not None and self._ours:
            seed = [seed]  # the prompt's own seed (an int would derive row 0's from it)
        config = dataclasses.replace(config, max_tokens_to_generate=limit, seed=seed)
        started = learner.policy_version
        rollout = self._cluster.rollout
        if self.token_in and episode.ids:
            _, env_messages = tunix_compat.get_recent_assistant_user_messages(chat_lists)
            env_ids, _ = tunix_compat.tokenize_and_generate_masks(
                env_messages,
                tokenizer=learner.tokenizer,
                parser=learner.chat_parser,
                contains_first_msg=False,
                contains_generation_msg=True,
            )
            prompt = episode.ids + [int(t) for t in env_ids]
            out = rollout.generate_from_ids([prompt], config)
        else:
            text = learner.chat_parser.parse(
                messages=chat_lists, add_generation_prompt=True, is_first_msg=True
            )
            out = rollout.generate([text], config)
            prompt = prompt_rows(out.left_padded_prompt_tokens, rollout.pad_id())[0]
        out = _ended_before_pad(out, rollout.pad_id())
        episode.ids = prompt + np.asarray(out.tokens[0]).tolist()
        episode.turns += 1
        if env is not None:
            sampled = started  # tunix's stamp, where the rollout reports no versions
            if self._ours:  # the version of the first token, or the rollout's for none
                first = out.versions[0][0] if len(out.tokens[0]) else rollout.policy_version
                sampled = int(first) - self._version_offset
            oldest = episode.oldest_version
            episode.oldest_version = sampled if oldest is None else min(oldest, sampled)
            env.task["policy_version"] = episode.oldest_version
        return out

    def _episode(self, env: Any) -> _Episode:
        if env is None:
            return _Episode()
        with self._lock:
            return self._episodes.setdefault(env, _Episode())


def serve_agentic(
    learner: Any, cluster: Any, token_in: bool = True, turn_tokens: int | None = None
) -> AgenticModelCall:
    """Makes `learner` (tunix's `AgenticGRPOLearner`, built on `cluster` whose rollout is our
    `SglangJaxRollout`, or with `token_in=False` tunix's vanilla one) call the rollout through
    `AgenticModelCall`; call it before `train`.

    Where the rollout samples with the actor's own weights (tunix's vanilla rollout on the
    actor's mesh: the learner's `should_sync_weights` is False), tunix's agentic learner never
    moves the cluster's anchor state after an update (it only counts the step,
    `agentic_rl_learner.py:1054-1055` at 0.1.7; `sync_weights` is what stores it), so the
    trainer scores every later episode with the first step's weights: its
    `sampler_trainer/logp_diff_*` and any old policy taken from the trainer are stale. On our
    `RolloutCluster` each update is then followed by `snapshot_policy`.

    The learner's rollouts-or-sync lock becomes a `LoopSafeRolloutSyncLock`: with tunix's, an
    episode that starts while a weight sync waits blocks the event loop every episode runs on,
    and `train()` hangs (`tunix_adapter/rollout_sync_lock.py` says how)."""
    model_call = AgenticModelCall(learner, cluster, token_in, turn_tokens)
    learner._model_call = model_call
    learner._rollout_sync_lock = LoopSafeRolloutSyncLock()
    if not learner.should_sync_weights and hasattr(cluster, "snapshot_policy"):
        update = cluster.update_actor

        def update_and_anchor(*args: Any, **kwargs: Any) -> Any:
            out = update(*args, **kwargs)
            cluster.snapshot_policy()
            return out

        cluster.update_actor = update_and_anchor
    return model_call


def _ended_before_pad(out: Any, pad: int) -> Any:
    """A one-row rollout output whose completion ended at a sampled pad id (its last token),
    ended before it: every per-token field loses its last entry (the text holds no pad)."""
    tokens = np.asarray(out.tokens[0])
    if not len(tokens) or int(tokens[-1]) != pad:
        return out
    fields = ("tokens", "logprobs", "entropy", "versions", "routed_experts")
    cut = {
        name: [np.asarray(getattr(out, name)[0])[:-1]]
        for name in fields
        if getattr(out, name, None) is not None
    }
    return dataclasses.replace(out, **cut)


def _call_seed(seed: Any, env: Any, turn: int) -> int | None:
    """One call's seed: None stays None (fresh seeds); an int gives each (group, pair, turn)
    its own, the same in every run."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(
            f"the agentic learner's RolloutConfig.seed must be None or an int, got {seed!r}"
        )
    extra = getattr(env, "extra_kwargs", {}) if env is not None else {}
    words = [int(seed), int(extra.get("group_id", 0)), int(extra.get("pair_index", 0)), turn]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0]) % MAX_SEED


def _scalar(value: Any) -> Any:
    """One example's field as tunix's learner hands it to an environment, as a value."""
    if isinstance(value, np.ndarray) and value.shape == (1,):
        return value[0].item() if hasattr(value[0], "item") else value[0]
    return value


class ToolPromptChatParser(tunix_compat.QwenChatTemplateParser):
    """tunix's `QwenChatTemplateParser`, its system and assistant messages keeping the
    tool-call tags.

    tunix's parser strips its own control strings from every message's content, its tool-call
    tags `"\n<tool_call>\n"` / `"\n</tool_call>"` among them (`parser.py:59-63,116-121` at
    0.1.7 and main). The system message `ToolAgent` writes holds the tool-call example of its
    tool parser (`qwen_parser.py:116-119`), whose tags are exactly those strings: the model was
    told to answer "within <tool_call></tool_call> XML tags:" followed by a bare JSON line.
    `ToolAgent` records the model's whole response as the assistant message
    (`tool_agent.py:150`), so wherever a chat is rendered to text again (tunix's
    `token_in=False` path, a held-out evaluation) the model's own calls lost their tags in
    later turns' prompts. Here system and assistant messages keep those two tags (everything
    else is stripped as tunix strips it); the user's and the tools' messages are tunix's."""

    _KEEPS_TOOL_TAGS = ("system", "assistant")

    def _parse_message(self, message: dict[str, str]) -> str:
        if message["role"] not in self._KEEPS_TOOL_TAGS:
            return super()._parse_message(message)
        tags = {self.tokens.tool_start_token, self.tokens.tool_end_token}
        content = tunix_compat.sanitize_control_tokens(
            message["content"],
            extra_tokens=self._tokens_to_sanitize - tags,
            include_default=not self._tokens_to_sanitize,
        )
        if message["role"] == "system":
            return self._parse_system(content)
        return self._parse_assistant(content)


class ScalarTaskEnvironment(tunix_compat.TaskEnvironment):
    """tunix's `TaskEnvironment` whose first observation holds the example's fields as values.

    tunix's learner hands each field as a one-element array (`agentic_rl_learner.py:393`,
    `np.array(micro_batch_list_slice)`), and its agents put the observation's `prompts` /
    `question` in the user message as it is (`base_agent.py:173`): the model was asked
    "['17 + 13 =']"."""

    def _initial_observation(self) -> dict[str, Any]:
        return {key: _scalar(value) for key, value in self.task.items()}


class ScalarToolEnvironment(tunix_compat.ToolEnvironment):
    """tunix's `ToolEnvironment` (tool calls run, the final answer scored by its `reward_fn(task,
    action)`), its task's fields as values: in the first observation, which `ToolAgent` reads
    its question from (`tool_agent.py:93`), and in the task its `reward_fn` scores against
    (the same one-element arrays as `ScalarTaskEnvironment`'s)."""

    def __init__(self, task: dict[str, Any] | None = None, **kwargs: Any) -> None:
        task = {key: _scalar(value) for key, value in (task or {}).items()}
        super().__init__(task, **kwargs)

    def _initial_observation(self) -> dict[str, Any]:
        """The task, with its `prompts` as the `question` where it has none: tunix's learner
        needs a `prompts` column (`agentic_grpo_learner.py:517` at 0.1.7) and `ToolAgent`
        asks only a `question` (`tool_agent.py:93`; without one the episode has no user
        message)."""
        return {"question": self.task.get("prompts"), **self.task}
