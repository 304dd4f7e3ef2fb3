"""Partial rollouts: groups paused when a step has enough, continued after a weight update.

Owns `Member` (one sample so far: tokens, their logprobs and entropy, the policy version that
sampled each token, and its own length limit where the caller gave one), `Group` (a prompt's
samples, under the caller's key) and `PausedGroups`, the rollout's buffer between calls:

- `pause` keeps a group that was not needed (its unfinished samples were aborted in the
  engine, their KV freed);
- `resume` hands the paused groups back at the next call, dropping those whose oldest token
  is more than `max_staleness` policy versions old (AReaL's `max_head_offpolicyness`);
- `Member.request` is what continues a sample: the prompt followed by its tokens so far, as a
  new prompt, with the rest of the length budget. The prompt's KV is recomputed under the
  current weights: every weight update flushes the engine's prefix cache, so no KV of an
  older version is ever served.
- `StopRule` is where a sample ends, checked again over the whole sample at each `extend`. The
  engine cannot see it twice: an aborted request gets one more token that no stop check sees
  (sgl-jax cddbf6f1 `Req.check_finished` returns at `to_finish` before any stop id or string),
  and a continuation matches stop strings in its own tokens only, so a string spanning the
  pause is missed. A sample whose tokens hold a stop ends there (tokens after it dropped, with
  their logprobs, entropy and versions), instead of being continued past it.

No engine import: the rollout submits the requests (`SglangJaxRollout.generate_groups`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

# A continued sample draws from a stream of its own: its seed, moved by its length so far.
_SEED_STRIDE = 0x9E3779B1
_SEED_MASK = (1 << 63) - 1


@dataclasses.dataclass(frozen=True)
class StopRule:
    """The engine's stop checks, token by token (sgl-jax `Req.check_finished`): token `k` ends
    the sample when it is one of `ids` (none with `ignore_eos`), or when the decoded text of the
    last `tail` tokens up to it holds one of `strings` (`tail` = the longest stop string's token
    count + 1, the engine's `stop_str_max_len + 1`)."""

    ids: frozenset[int] = frozenset()
    strings: tuple[str, ...] = ()
    tail: int = 1
    decode: Callable[[list[int]], str] | None = None

    def end(self, tokens: Sequence[int], start: int = 0) -> int | None:
        """The sample's length if a token at index >= `start` ends it, else None."""
        for k in range(start, len(tokens)):
            if tokens[k] in self.ids:
                return k + 1
            if self.strings and self.decode is not None:
                text = self.decode(list(tokens[max(0, k + 1 - self.tail) : k + 1]))
                if any(s in text for s in self.strings):
                    return k + 1
        return None


@dataclasses.dataclass(eq=False)
class Member:
    seed: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    entropy: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    done: bool = False  # ended for real: a stop id or the length limit
    limit: int | None = None  # its own max new tokens, where the caller gave one

    def budget(self, limit: int) -> int:
        """Its max new tokens in a call whose limit is `limit`: its own, never above."""
        return limit if self.limit is None else min(self.limit, limit)

    def request(self, prompt: list[int], limit: int) -> tuple[list[int], int, int]:
        """(ids, max new tokens, seed) that continue this sample."""
        seed = (self.seed + _SEED_STRIDE * len(self.tokens)) & _SEED_MASK
        return prompt + self.tokens, self.budget(limit) - len(self.tokens), seed

    def preview(self, completion: Any, stops: StopRule) -> list[int]:
        """The tokens `extend(completion, ..., stops)` would leave it with (nothing changes)."""
        tokens = self.tokens + list(completion.tokens)
        end = stops.end(tokens, len(self.tokens))
        return tokens if end is None else tokens[:end]

    def extend(
        self, completion: Any, version: int, limit: int, stops: StopRule = StopRule()
    ) -> None:
        """Appends what the engine sampled for it (a `Completion`) under `version`; cut at
        the first stop `stops` finds in the new tokens (with text from before them)."""
        new = list(completion.tokens)
        start = len(self.tokens)
        self.tokens += new
        self.logprobs += list(completion.logprobs or [0.0] * len(new))
        self.entropy += list(completion.entropy or [0.0] * len(new))
        self.versions += [version] * len(new)
        end = stops.end(self.tokens, start)
        if end is not None:
            for name in ("tokens", "logprobs", "entropy", "versions"):
                setattr(self, name, getattr(self, name)[:end])
            self.done = True
            return
        reason = completion.finish_reason
        aborted = isinstance(reason, dict) and reason.get("type") == "abort"
        self.done = not aborted or len(self.tokens) >= self.budget(limit)


@dataclasses.dataclass(eq=False)  # groups are told apart by identity
class Group:
    key: Any
    prompt: list[int]
    members: list[Member]

    @property
    def complete(self) -> bool:
        return all(m.done for m in self.members)

    def oldest_version(self) -> int | None:
        versions = [m.versions[0] for m in self.members if m.versions]
        return min(versions) if versions else None


class PausedGroups:
    def __init__(self) -> None:
        self._groups: list[Group] = []
        self.dropped = 0  # groups dropped as too stale, over the rollout's life

    def __len__(self) -> int:
        return len(self._groups)

    def keys(self, version: int, max_staleness: int) -> list[Any]:
        """The keys of the paused groups `resume(version, max_staleness)` would continue."""
        return [g.key for g in self._groups if not _stale(g, version, max_staleness)]

    def pause(self, groups: list[Group]) -> None:
        self._groups += groups

    def resume(self, version: int, max_staleness: int) -> list[Group]:
        """The paused groups, oldest first, less those older than `max_staleness` versions."""
        groups, self._groups = self._groups, []
        kept = []
        for group in groups:
            if _stale(group, version, max_staleness):
                self.dropped += 1
            else:
                kept.append(group)
        return kept

    def clear(self) -> int:
        """Drops every paused group; returns how many there were."""
        count, self._groups = len(self._groups), []
        return count


def _stale(group: Group, version: int, max_staleness: int) -> bool:
    oldest = group.oldest_version()
    return oldest is not None and version - oldest > max_staleness
