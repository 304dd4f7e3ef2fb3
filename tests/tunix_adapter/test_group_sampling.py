"""DAPO's group filter against each peer's formula, and the rounds of `GroupSampler`.

The rounds are tested with a stand-in for the rollout's `generate_groups` (a test double:
these tests are about the sampler's bookkeeping around the rollout, not the engine; the
engine runs them in `test_group_sampling_engine.py`).
"""

import dataclasses
import statistics

import numpy as np
import pytest

from tunix_adapter.group_sampling import GroupSampler, keeps_group, split_groups


@pytest.mark.parametrize(
    "values",
    [[1.0, 1.0, 1.0], [0.0, 1.0], [0.5], [0.3, 0.3 + 1e-7, 0.3], [2.0, 2.0 + 3e-6], [-1.0, 1.0]],
)
def test_filter_matches_verl_and_slime(values):
    # verl: np.std (population) > 0, or a group of one; slime: torch's unbiased std in float64
    # > 1e-6 (a group of one has a nan std, which fails the comparison)
    verl = len(values) == 1 or statistics.pstdev(values) > 0
    slime = len(values) > 1 and statistics.stdev(values) > 1e-6
    assert keeps_group(np.array(values), "verl") == verl
    assert keeps_group(np.array(values), "slime") == slime


def test_filter_rules_differ_where_the_peers_do():
    assert keeps_group(np.array([0.5]), "verl") and not keeps_group(np.array([0.5]), "slime")
    tiny = np.array([0.3, 0.3 + 1e-7, 0.3])
    assert keeps_group(tiny, "verl") and not keeps_group(tiny, "slime")
    with pytest.raises(ValueError, match="filter_groups must be one of"):
        keeps_group(tiny, "dapo")


@dataclasses.dataclass
class Output:  # the fields of a rollout output the sampler handles: per-row lists and arrays
    text: list
    tokens: list
    left_padded_prompt_tokens: np.ndarray
    logprobs: list | None = None


class FakeRollout:
    """Stands in for `generate_groups`: runs until `groups_needed` groups are complete (with
    `accept`, until that many finished groups passed it, a refused one dropped), the groups
    whose prompt `slow(prompt)` says is slow last; the others are aborted, or with `partial`
    paused and sent first at the next call."""

    def __init__(self, n, slow=lambda p: False, partial=False):
        self.n, self.slow, self.partial = n, slow, partial
        self.calls, self.paused = [], []

    def __call__(self, prompts, keys, groups_needed, accept=None):
        self.calls.append((list(prompts), list(keys), groups_needed))
        pending = self.paused + list(zip(keys, prompts, strict=True))
        order = [x for x in pending if not self.slow(x[1])] + [
            x for x in pending if self.slow(x[1])
        ]
        finished, refused = order[:groups_needed], []
        if accept is not None:
            finished = []
            for key, prompt in order:
                if len(finished) == groups_needed:
                    break
                texts = [f"{prompt}|{i}" for i in range(self.n)]
                (finished if accept(key, texts) else refused).append((key, prompt))
        done = [x for x in pending if x in finished]
        self.paused = [x for x in pending if x not in done + refused] if self.partial else []
        rows = [(k, p) for k, p in done for _ in range(self.n)]
        out = Output(
            text=[f"{p}|{i % self.n}" for i, (_, p) in enumerate(rows)],
            tokens=[np.array([i]) for i in range(len(rows))],
            left_padded_prompt_tokens=np.arange(len(rows))[:, None].repeat(3, 1),
            logprobs=[np.array([-0.5]) for _ in rows],
        )
        return out, [k for k, _ in done]

    def paused_keys(self):
        return [k for k, _ in self.paused]


def reward_of(table):
    """Rewards by prompt: `table[prompt]` lists the n samples' rewards."""

    def score(groups, output):
        rows = [(g, j) for g in groups for j in range(len(table[g.prompt]))]
        rewards = np.array([table[g.prompt][j] for g, j in rows])
        return {
            "rewards": rewards,
            "log_metrics": {
                "rewards/sum": (rewards, np.mean),
                "rewards/acc": ((rewards > 0).astype(float), np.mean),
                "prompts": ([g.prompt for g, _ in rows], None),
            },
        }

    return score


def stream(prompts, size):
    batches = iter(
        [{"prompts": np.array(prompts[i : i + size])} for i in range(0, len(prompts), size)]
    )
    return lambda: next(batches)


def batch(prompts, n):
    return {
        "prompts": np.repeat(np.array(prompts), n),
        "trajectory_ids": [f"{i}_{g}" for i in range(len(prompts)) for g in range(n)],
    }


def sampler(rollout, score, draw, **kw):
    settings = dict(filter_rule="verl", metric="reward", max_num_gen_batches=0)
    settings.update(kw)
    return GroupSampler(
        n=rollout.n,
        over_sampling_batch_size=settings.pop("over_sampling_batch_size", None),
        generate=rollout,
        score=score,
        draw=draw,
        paused_keys=rollout.paused_keys if rollout.partial else None,
        **settings,
    )


def test_filter_keeps_sampling_rounds_until_the_batch_is_full():
    n = 2
    table = {"a": [1, 1], "b": [0, 1], "c": [0, 0], "d": [1, 0], "e": [0, 1], "f": [0, 1]}
    rollout = FakeRollout(n)
    s = sampler(rollout, reward_of(table), stream(["c", "d", "e", "f"], 4))
    got = s.collect(s.split(batch(["a", "b"], n)))
    # round 1: a (filtered), b; round 2 draws 2: c (filtered), d -> full
    assert [g.prompt for g in got.groups] == ["b", "d"]
    assert [c[2] for c in rollout.calls] == [2, 2]  # the filter alone: every group, no early stop
    stats = got.stats
    assert (stats.num_gen_batches, stats.groups_sampled, stats.groups_filtered) == (2, 4, 2)
    assert stats.groups_kept == 2 and stats.groups_aborted == stats.groups_discarded == 0
    # rows, rewards and metrics are the kept groups', a group's n adjacent
    assert got.output.text == ["b|0", "b|1", "d|0", "d|1"]
    np.testing.assert_array_equal(got.rewards["rewards"], [0, 1, 1, 0])
    assert got.rewards["log_metrics"]["prompts"][0] == ["b", "b", "d", "d"]
    # a drawn group has the batch's columns, its own trajectory ids
    d = got.groups[1]
    assert d.columns["trajectory_ids"] == [f"drawn{d.key}_0", f"drawn{d.key}_1"]
    # the rest of the drawn micro-batch waits for the next round or step
    more = s.collect(s.split(batch(["b"], n)))
    assert [g.prompt for g in more.groups] == ["b"] and rollout.calls[-1][0] == ["b"]
    assert s._drawn and [g.prompt for g in s._drawn] == ["e", "f"]


def test_a_reward_function_as_the_filter_metric_and_the_cap():
    n = 2
    table = {"a": [1, 2], "b": [1, 2]}  # the sum varies, "acc" (reward > 0) does not
    rollout = FakeRollout(n)
    s = sampler(rollout, reward_of(table), stream(["a", "b"] * 4, 2), metric="acc")
    s.max_num_gen_batches = 3
    with pytest.raises(ValueError, match="num_gen_batches=3 >= max_num_gen_batches=3"):
        s.collect(s.split(batch(["a", "b"], n)))
    s = sampler(rollout, reward_of(table), stream([], 2), metric="score")
    with pytest.raises(ValueError, match="names no reward function.*'acc'"):
        s.collect(s.split(batch(["a"], n)))
    s = sampler(rollout, reward_of(table), stream([], 2), metric="reward")
    assert len(s.collect(s.split(batch(["a"], n))).groups) == 1


def test_the_data_running_out_is_named():
    rollout = FakeRollout(2)
    s = sampler(rollout, reward_of({"a": [1, 1]}), stream(["a"], 1))
    with pytest.raises(ValueError, match="data ran out after 2 gen batches with 0 of the 1"):
        s.collect(s.split(batch(["a"], 2)))


def test_over_sampling_asks_for_what_is_missing_and_counts_the_aborted():
    """`filter_timing="after_stop"`: a round stops at the groups it needs finished, then
    filters them."""
    n = 2
    table = {p: [0, 1] for p in "abcdefgh"}
    table["a"] = [1, 1]
    rollout = FakeRollout(n, slow=lambda p: p == "c")
    data = stream(list("efgh"), 4)
    s = sampler(
        rollout, reward_of(table), data, over_sampling_batch_size=5, filter_timing="after_stop"
    )
    got = s.collect(s.split(batch(["a", "b", "c"], n)))
    prompts, keys, needed = rollout.calls[0]
    assert prompts == ["a", "b", "c", "e", "f"] and needed == 3
    # round 1 returns a, b, e (c is slow): a is filtered; round 2 sends g, h for the 1 missing
    assert rollout.calls[1][2] == 1 and rollout.calls[1][0] == ["g", "h"]
    assert [g.prompt for g in got.groups] == ["b", "e", "g"]
    stats = got.stats
    assert stats.groups_filtered == 1 and stats.groups_kept == 3
    assert stats.groups_sampled == 7 and stats.groups_aborted == 7 - 3 - 1  # not returned
    assert stats.groups_discarded == 0
    with pytest.raises(ValueError, match="over_sampling_batch_size=2 is below the batch's 3"):
        sampler(rollout, reward_of(table), stream([], 1), over_sampling_batch_size=2).collect(
            s.split(batch(["a", "b", "c"], n))
        )


def test_slimes_timing_filters_each_group_as_it_finishes_and_stops_when_enough_passed():
    """The default, slime's `generate_rollout_async`: the same batch and data as above. a
    finishes first and is filtered out; b, e and f pass, which is enough: one round, and only
    the slow c aborted (after the stop, g would have been sent for the filtered a instead).
    Each finished group is scored once, on its own texts; the kept groups' rewards are those."""
    n = 2
    table = {p: [0, 1] for p in "abcdefgh"}
    table["a"] = [1, 1]
    rollout = FakeRollout(n, slow=lambda p: p == "c")
    calls = []
    score = reward_of(table)

    def counted(groups, output):
        calls.append(([g.prompt for g in groups], list(output.text)))
        return score(groups, output)

    s = sampler(rollout, counted, stream(list("efgh"), 4), over_sampling_batch_size=5)
    got = s.collect(s.split(batch(["a", "b", "c"], n)))
    assert len(rollout.calls) == 1 and rollout.calls[0][2] == 3
    assert [g.prompt for g in got.groups] == ["b", "e", "f"]
    assert calls == [([p], [f"{p}|0", f"{p}|1"]) for p in "abef"]
    np.testing.assert_array_equal(got.rewards["rewards"], [0, 1] * 3)
    stats = got.stats
    assert (stats.num_gen_batches, stats.groups_sampled, stats.groups_kept) == (1, 5, 3)
    assert (stats.groups_filtered, stats.groups_aborted, stats.groups_discarded) == (1, 1, 0)
    with pytest.raises(ValueError, match=r"filter_timing must be one of \('slime', 'after_stop'\)"):
        sampler(rollout, counted, stream([], 1), filter_timing="first")


def test_a_round_whose_every_group_is_refused_is_followed_by_another():
    """slime's timing: every group of the first round fails the filter, so the rollout returns
    none; the sampler sends more instead of scoring an empty round."""
    n = 2
    table = {p: [1, 1] for p in "ab"} | {p: [0, 1] for p in "cd"}
    rollout = FakeRollout(n)
    s = sampler(rollout, reward_of(table), stream(list("cd"), 2), over_sampling_batch_size=2)
    got = s.collect(s.split(batch(["a", "b"], n)))
    assert [g.prompt for g in got.groups] == ["c", "d"]
    assert (got.stats.num_gen_batches, got.stats.groups_filtered) == (2, 2)


def test_partial_rollouts_keep_the_paused_groups_inputs_until_they_come_back():
    n = 2
    table = {p: [0, 1] for p in "abcdef"}
    slow = {"b"}
    rollout = FakeRollout(n, slow=lambda p: p in slow, partial=True)
    drawn = iter([{"prompts": np.array(["c"]), "answer": np.array([3])}])
    s = sampler(
        rollout, reward_of(table), lambda: next(drawn), filter_rule=None, over_sampling_batch_size=3
    )
    first = s.collect(s.split({**batch(["a", "b"], n), "answer": np.array([1, 1, 2, 2])}))
    assert [g.prompt for g in first.groups] == ["a", "c"]
    # b was paused, its inputs (its dataset fields too) held under its key
    assert [g.prompt for g in s._paused.values()] == ["b"] == [p for _, p in rollout.paused]
    slow.clear()
    second = s.collect(s.split({**batch(["d"], n), "answer": np.array([4, 4])}))
    # b comes back first, with its own fields; d is not needed and is paused in turn
    assert [g.prompt for g in second.groups] == ["b"]
    np.testing.assert_array_equal(second.groups[0].columns["answer"], [2, 2])
    assert second.stats.groups_resumed == 1 and second.stats.groups_aborted == 1
    assert [g.prompt for g in s._paused.values()] == ["d"]
    # a paused group the rollout dropped (stale) is no longer held
    rollout.paused = []
    third = s.collect(s.split({**batch(["e"], n), "answer": np.array([5, 5])}))
    assert [g.prompt for g in third.groups] == ["e"] and not s._paused


def test_paused_groups_take_the_place_of_new_prompts_in_a_round():
    """slime draws a round's prompts from its buffer first: a round sends at most
    over_sampling_batch_size groups, paused ones included; the batch's own groups that do not
    fit wait for a later round or batch."""
    n = 2
    table = {p: [0, 1] for p in "abcd"}
    rollout = FakeRollout(n, partial=True)
    drawn = iter([{"prompts": np.array(["b"])}])
    s = sampler(
        rollout, reward_of(table), lambda: next(drawn), filter_rule=None, over_sampling_batch_size=2
    )
    assert [g.prompt for g in s.collect(s.split(batch(["a"], n))).groups] == ["a"]
    assert [g.prompt for g in s._paused.values()] == ["b"]
    got = s.collect(s.split(batch(["c", "d"], n)))
    assert rollout.calls[-1][0] == ["c"]  # b (paused) and c fill the round of 2
    assert [g.prompt for g in got.groups] == ["b", "c"]
    assert [g.prompt for g in s._drawn] == ["d"] and not s._paused


def test_split_refuses_a_batch_that_is_not_whole_groups():
    with pytest.raises(ValueError, match="not a multiple of num_generations=4"):
        split_groups({"prompts": ["a"] * 6}, 4, iter(range(10)))
