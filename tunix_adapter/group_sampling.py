"""Dynamic sampling for GRPO: the rounds between tunix's batch of B prompts and its example.

Owns:
- `keeps_group(values, rule)`: DAPO's filter on one group's metric values, as each peer
  writes it. `"verl"` keeps a group whose population std is > 0, or a group of one
  (`algorithm.filter_groups`, `recipe/dapo/dapo_ray_trainer.py`: `np.std(metric_vals)`);
  `"slime"` keeps a group whose float64 unbiased std is > 1e-6 (`check_reward_nonzero_std`,
  `slime/rollout/filter_hub/dynamic_sampling_filters.py`; a group of one has none).
- `GroupInput`: one prompt's rows of tunix's training input (its n repeats: the prompt, the
  dataset's fields, tunix's trajectory ids), split from and joined back into tunix's columns.
- `GroupSampler`: the rounds. Each round sends a gen batch of groups to the rollout (the
  batch's own B groups first, then groups drawn from the data iterator), asks for the
  groups still missing when it may stop early (over-sampling, partial rollouts) or for all
  of them (the filter alone, as verl generates), scores what came back with the reward
  functions, keeps the groups the filter passes, and goes on until B are kept; past
  `max_num_gen_batches` rounds (verl's cap; <= 0: no cap) it raises, as verl does. Groups
  that pass beyond B are discarded (verl truncates the batch the same way). With partial
  rollouts it keeps the inputs of the groups the rollout paused, under the keys it gave them,
  until they come back or the rollout drops them.
- `FILTER_TIMINGS`: when a round that stops early filters. `"slime"` (the default, slime's
  `generate_rollout_async`): each group is scored and filtered as it finishes, while the
  engine goes on, and the round stops once the groups it needs have *passed*; a round whose
  groups all finished short of that ends, and the next sends more. `"after_stop"`: the round
  stops once the groups it needs have *finished*, then filters them, and aborts the others,
  some of which would have passed (each round costs one reward call, not one per group).
- `SamplingStats`: what the rounds did, as metrics (`dynamic_sampling/*`).

Nothing here imports tunix or the engine: the learner hands the sampler its rollout call, its
reward call and its data source (`learners.py`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from jaxtyping import Float

FILTERS = ("verl", "slime")
FILTER_TIMINGS = ("slime", "after_stop")
SLIME_MIN_STD = 1e-6  # check_reward_nonzero_std's threshold


def keeps_group(values: Float[np.ndarray, " n"], rule: str) -> bool:
    """Whether DAPO's filter (`rule`, one of `FILTERS`) keeps a group with these values."""
    values = np.asarray(values, np.float64)
    if rule == "verl":
        return bool(values.size == 1 or np.std(values) > 0)
    if rule == "slime":
        return bool(values.size > 1 and np.std(values, ddof=1) > SLIME_MIN_STD)
    raise ValueError(f"filter_groups must be one of {FILTERS} (or None), got {rule!r}")


@dataclasses.dataclass(eq=False)
class GroupInput:
    """One prompt's n rows of tunix's training input, column by column."""

    key: int
    columns: dict[str, Any]

    @property
    def prompt(self) -> str:
        return self.columns["prompts"][0]


def split_groups(
    training_input: Mapping[str, Any], n: int, keys: Iterator[int]
) -> list[GroupInput]:
    """tunix's batch (every prompt repeated n times, adjacent) as one `GroupInput` per prompt."""
    rows = len(training_input["prompts"])
    if rows % n:
        raise ValueError(f"the batch has {rows} rows, not a multiple of num_generations={n}")
    return [
        GroupInput(next(keys), {k: v[i : i + n] for k, v in training_input.items()})
        for i in range(0, rows, n)
    ]


def drawn_groups(
    micro_batch: Mapping[str, Any], n: int, keys: Iterator[int], columns: set[str]
) -> list[GroupInput]:
    """A micro-batch of the data iterator (one row per prompt) as groups of n repeats, with
    trajectory ids of their own where tunix's batch has them (`columns`: the batch's)."""
    groups = []
    for i in range(len(micro_batch["prompts"])):
        key = next(keys)
        group = {k: _repeat(v, i, n) for k, v in micro_batch.items()}
        if "trajectory_ids" in columns and "trajectory_ids" not in group:
            group["trajectory_ids"] = [f"drawn{key}_{g}" for g in range(n)]
        if set(group) != columns:
            raise ValueError(
                f"a drawn micro-batch has the fields {sorted(group)}, the batch {sorted(columns)}"
            )
        groups.append(GroupInput(key, group))
    return groups


def join_groups(groups: list[GroupInput]) -> dict[str, Any]:
    """The groups' rows as tunix's batch columns (numpy where the groups hold numpy)."""
    return {name: _concat([g.columns[name] for g in groups]) for name in groups[0].columns}


def concat_rows(parts: list[tuple[Any, np.ndarray]]) -> Any:
    """One rollout output of the given rows of several (`(output, row indices)` each): every
    per-row list and array field taken row by row, None where every part has None."""
    first = parts[0][0]
    fields = {}
    for field in dataclasses.fields(first):
        values = [getattr(out, field.name) for out, _ in parts]
        if all(v is None for v in values):
            fields[field.name] = None
            continue
        if any(v is None for v in values):
            raise ValueError(f"rollout outputs differ in whether they carry {field.name!r}")
        fields[field.name] = _concat(
            [_take(v, rows) for v, (_, rows) in zip(values, parts, strict=True)]
        )
    return type(first)(**fields)


def concat_rewards(parts: list[tuple[Mapping[str, Any], np.ndarray]]) -> dict[str, Any]:
    """One reward result (`{"rewards": [rows], "log_metrics": {name: (per-row values, agg)}}`,
    a tunix reward manager's) of the given rows of several."""
    rewards = np.concatenate([np.asarray(info["rewards"])[rows] for info, rows in parts])
    log_metrics = {}
    for name, (value, agg) in parts[0][0]["log_metrics"].items():
        values = [info["log_metrics"][name][0] for info, _ in parts]
        if all(
            _per_row(v, len(info["rewards"])) for v, (info, _) in zip(values, parts, strict=True)
        ):
            value = _concat([_take(v, rows) for v, (_, rows) in zip(values, parts, strict=True)])
        log_metrics[name] = (value, agg)  # else not one value per row: the first round's
    return {"rewards": rewards, "log_metrics": log_metrics}


@dataclasses.dataclass
class SamplingStats:
    num_gen_batches: int = 0  # rounds (verl's train/num_gen_batches)
    groups_sampled: int = 0  # new prompts sent, over every round
    groups_resumed: int = 0  # paused groups that came back complete (partial rollouts)
    groups_kept: int = 0
    groups_filtered: int = 0  # complete, but the filter found no reward variance
    groups_aborted: int = 0  # new groups not returned: aborted, or paused (partial rollouts)
    groups_discarded: int = 0  # passed beyond the B the batch needs

    def metrics(self) -> dict[str, tuple[float, Any]]:
        return {
            f"dynamic_sampling/{f.name}": (float(getattr(self, f.name)), np.mean)
            for f in dataclasses.fields(self)
        }


@dataclasses.dataclass
class _Texts:
    """A group's texts where the reward call reads a rollout output (its `text`)."""

    text: list[str]


@dataclasses.dataclass
class Collected:
    groups: list[GroupInput]  # the B kept, in the order they were kept
    output: Any  # their rollout rows, a group's n adjacent
    rewards: dict[str, Any]  # their reward result
    stats: SamplingStats


class GroupSampler:
    """The rounds of one learner (its state lives across steps: the data drawn but not yet
    sent, and with partial rollouts the inputs of the paused groups).

    - `generate(prompts, keys, groups_needed) -> (output, kept keys)`: the rollout's
      `generate_groups` for one round (n samples per prompt);
    - `score(groups, output) -> reward result`: the reward functions on the groups' rows;
    - `draw() -> micro-batch`: the next micro-batch of the data iterator (StopIteration at
      its end);
    - `paused_keys() -> keys`: the groups the rollout holds paused (None: no partial
      rollouts).
    """

    def __init__(
        self,
        *,
        n: int,
        filter_rule: str | None,
        metric: str,
        max_num_gen_batches: int,
        over_sampling_batch_size: int | None,
        generate: Callable[..., tuple[Any, list[int]]],
        score: Callable[[list[GroupInput], Any], Mapping[str, Any]],
        draw: Callable[[], Mapping[str, Any]],
        paused_keys: Callable[[], list[int]] | None = None,
        filter_timing: str = "slime",
    ) -> None:
        if filter_rule is not None and filter_rule not in FILTERS:
            raise ValueError(
                f"filter_groups must be one of {FILTERS} (or None), got {filter_rule!r}"
            )
        if filter_timing not in FILTER_TIMINGS:
            raise ValueError(
                f"filter_timing must be one of {FILTER_TIMINGS}, got {filter_timing!r}"
            )
        self.n, self.filter_rule, self.metric = n, filter_rule, metric
        self.filter_timing = filter_timing
        self.max_num_gen_batches = max_num_gen_batches
        self.over_sampling_batch_size = over_sampling_batch_size
        self._generate, self._score, self._draw = generate, score, draw
        self._paused_keys = paused_keys
        self._keys = itertools.count()
        self._drawn: list[GroupInput] = []  # drawn from the iterator, not sent yet
        self._paused: dict[int, GroupInput] = {}  # inputs of the groups the rollout paused

    def split(self, training_input: Mapping[str, Any]) -> list[GroupInput]:
        return split_groups(training_input, self.n, self._keys)

    def collect(self, batch: list[GroupInput]) -> Collected:
        """B = len(batch) groups that pass the filter (every complete group without one)."""
        need = len(batch)
        size = self.over_sampling_batch_size or need
        if size < need:
            raise ValueError(
                f"over_sampling_batch_size={size} is below the batch's {need} groups: it must "
                f"be >= {need} (slime: --over-sampling-batch-size >= --rollout-batch-size)"
            )
        early = self.over_sampling_batch_size is not None or self._paused_keys is not None
        judged = early and self.filter_rule is not None and self.filter_timing == "slime"
        stats = SamplingStats()
        kept: list[tuple[GroupInput, Any, Mapping[str, Any], np.ndarray]] = []
        fresh = list(batch)
        columns = set(batch[0].columns)
        while len(kept) < need:
            room = size - len(self._held_paused())  # paused groups go first, as in slime
            fresh += self._take(room - len(fresh), columns)
            if len(fresh) > room:  # the rest of the batch's own groups wait their turn
                fresh, self._drawn = fresh[: max(room, 0)], fresh[max(room, 0) :] + self._drawn
            if not fresh and not self._paused:
                raise ValueError(
                    f"the data ran out after {stats.num_gen_batches} gen batches with "
                    f"{len(kept)} of the {need} groups the batch needs kept"
                )
            stats.num_gen_batches += 1
            stats.groups_sampled += len(fresh)
            sent = {g.key: g for g in fresh}
            lookup = {**self._paused, **sent}
            missing = min(need - len(kept), len(lookup))
            wanted = missing if early else len(fresh)
            scored: dict[int, Mapping[str, Any]] = {}
            prompts = [g.prompt for g in fresh]
            if judged:
                accept = self._accepts(lookup, sent, scored, stats)
                output, keys = self._generate(prompts, list(sent), wanted, accept)
            else:
                output, keys = self._generate(prompts, list(sent), wanted)
            groups = [lookup[k] for k in keys]
            stats.groups_resumed += sum(k not in sent for k in keys)
            stats.groups_aborted += len(sent) - sum(k in sent for k in keys)
            if self._paused_keys is not None:
                self._paused = lookup
                self._held_paused()
            rewards = values = None  # none where the filter refused every group of the round
            if keys and judged:
                rewards = concat_rewards([(scored[k], np.arange(self.n)) for k in keys])
            elif keys:
                rewards = self._score(groups, output)
            if keys:
                values = self._metric_values(rewards)
            for i, group in enumerate(groups):
                rows = np.arange(i * self.n, (i + 1) * self.n)
                if self.filter_rule is not None and not keeps_group(values[rows], self.filter_rule):
                    stats.groups_filtered += 1
                elif len(kept) < need:
                    kept.append((group, output, rewards, rows))
                else:
                    stats.groups_discarded += 1
            fresh = []
            cap = self.max_num_gen_batches
            if len(kept) < need and 0 < cap <= stats.num_gen_batches:
                raise ValueError(
                    f"num_gen_batches={stats.num_gen_batches} >= max_num_gen_batches={cap} with "
                    f"{len(kept)} of {need} groups kept: generated too many; the data may be too "
                    "easy or too hard for the filter. max_num_gen_batches=0 removes the cap"
                )
        stats.groups_kept = len(kept)
        return Collected(
            groups=[g for g, *_ in kept],
            output=concat_rows([(out, rows) for _, out, _, rows in kept]),
            rewards=concat_rewards([(info, rows) for _, _, info, rows in kept]),
            stats=stats,
        )

    def _accepts(
        self,
        lookup: Mapping[int, GroupInput],
        sent: Mapping[int, GroupInput],
        scored: dict[int, Mapping[str, Any]],
        stats: SamplingStats,
    ) -> Callable[[int, list[str]], bool]:
        """slime's filter as groups finish: scores the group of `key` on its texts (kept in
        `scored`), true when the filter passes it; a refusal is counted as filtered."""

        def accept(key: int, texts: list[str]) -> bool:
            scored[key] = self._score([lookup[key]], _Texts(texts))
            if keeps_group(self._metric_values(scored[key]), self.filter_rule):
                return True
            stats.groups_filtered += 1
            stats.groups_aborted -= key in sent  # finished, then dropped by the filter
            return False

        return accept

    def _held_paused(self) -> dict[int, GroupInput]:
        """The inputs of the groups the rollout will continue at its next call (others are
        let go: returned, or dropped as stale)."""
        if self._paused_keys is not None:
            paused = set(self._paused_keys())
            self._paused = {k: g for k, g in self._paused.items() if k in paused}
        return self._paused

    def _take(self, count: int, columns: set[str]) -> list[GroupInput]:
        """Up to `count` groups from the drawn ones, drawing micro-batches as needed."""
        while len(self._drawn) < count:
            try:
                micro_batch = self._draw()
            except StopIteration:
                break
            self._drawn += drawn_groups(micro_batch, self.n, self._keys, columns)
        taken, self._drawn = self._drawn[: max(count, 0)], self._drawn[max(count, 0) :]
        return taken

    def _metric_values(self, rewards: Mapping[str, Any]) -> np.ndarray:
        """The filter's metric per row: the summed reward, or one reward function's."""
        if self.metric == "reward":
            return np.asarray(rewards["rewards"], np.float64)
        name = f"rewards/{self.metric}"
        if name not in rewards["log_metrics"]:
            known = sorted(k[8:] for k in rewards["log_metrics"] if k.startswith("rewards/"))
            raise ValueError(
                f"filter_groups_metric={self.metric!r} names no reward function; it must be "
                f"'reward' (the summed reward) or one of {known}"
            )
        return np.asarray(rewards["log_metrics"][name][0], np.float64)


def _repeat(values: Any, i: int, n: int) -> Any:
    if isinstance(values, np.ndarray):
        return np.repeat(values[i : i + 1], n, axis=0)
    return [values[i]] * n


def _take(values: Any, rows: np.ndarray) -> Any:
    if isinstance(values, np.ndarray):
        return values[rows]
    return [values[i] for i in rows]


def _per_row(values: Any, rows: int) -> bool:
    return isinstance(values, (list, np.ndarray)) and np.ndim(values) > 0 and len(values) == rows


def _concat(parts: list[Any]) -> Any:
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    return list(itertools.chain.from_iterable(parts))
