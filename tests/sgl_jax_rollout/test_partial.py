"""Partial rollouts' bookkeeping (`sgl_jax_rollout.partial`) and the rollout's refusals, without
the engine (`test_groups_engine.py` drives them on the real one). `Done` is a test double of
the engine's `Completion` holding only the fields `Member.extend` reads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sgl_jax_rollout.engine.settings import EngineSettings
from sgl_jax_rollout.partial import Group, Member, PausedGroups, StopRule
from sgl_jax_rollout.partial_call import check_partial as _check_partial
from sgl_jax_rollout.partial_call import check_partial_options as _check_partial_options
from sgl_jax_rollout.rollout_inputs import sample_limits
from sgl_jax_rollout.sampling.options import SamplingOptions


@dataclasses.dataclass
class Done:
    tokens: list[int]
    logprobs: list[float]
    entropy: list[float]
    finish_reason: object


ABORT = {"type": "abort", "message": "Aborted"}


def test_a_member_continues_where_it_stopped_with_its_versions_and_a_moved_seed():
    m = Member(seed=11)
    ids, budget, seed = m.request([1, 2], 10)
    assert (ids, budget, seed) == ([1, 2], 10, 11)
    m.extend(Done([5, 6, 7], [-0.1, -0.2, -0.3], [1.0, 1.1, 1.2], ABORT), version=3, limit=10)
    assert not m.done and m.versions == [3, 3, 3]
    ids, budget, seed = m.request([1, 2], 10)
    assert ids == [1, 2, 5, 6, 7] and budget == 7 and seed != 11
    m.extend(Done([8], [-0.4], [1.3], {"type": "stop"}), version=4, limit=10)
    assert m.done and m.tokens == [5, 6, 7, 8] and m.versions == [3, 3, 3, 4]
    assert m.logprobs == [-0.1, -0.2, -0.3, -0.4]
    full = Member(seed=0)
    full.extend(Done([1] * 4, [0.0] * 4, [0.0] * 4, ABORT), version=0, limit=4)
    assert full.done  # aborted on its last token: nothing left to sample


def test_a_member_with_its_own_limit_stops_there_and_never_above_the_calls():
    m = Member(seed=0, limit=3)
    assert m.budget(10) == 3 and m.budget(2) == 2
    assert m.request([1], 10)[1] == 3
    m.extend(Done([5, 6], [0.0] * 2, [0.0] * 2, ABORT), version=0, limit=10)
    assert not m.done and m.request([1], 10) == ([1, 5, 6], 1, m.request([1], 10)[2])
    m.extend(Done([7], [0.0], [0.0], ABORT), version=1, limit=10)
    assert m.done  # aborted on its own last token
    assert Member(seed=0).budget(10) == 10  # none of its own: the call's


def test_a_member_aborted_on_a_stop_id_is_done_not_continued():
    """sgl-jax appends one more token to a request it aborts without checking it for stops: a
    stop id there ends the sample."""
    m = Member(seed=0)
    m.extend(Done([5, 2], [-0.1, -0.2], [1.0, 1.1], ABORT), 0, 10, StopRule(frozenset({2})))
    assert m.done and m.tokens == [5, 2] and m.versions == [0, 0]
    other = Member(seed=0)
    other.extend(Done([5, 6], [-0.1, -0.2], [1.0, 1.1], ABORT), 0, 10, StopRule(frozenset({2})))
    assert not other.done


def letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


def test_a_stop_string_spanning_the_pause_ends_the_sample_there():
    """A continuation matches stop strings in its own tokens only; "cde" starts before the
    pause and ends two tokens into the continuation, so the rest is dropped, aligned."""
    rule = StopRule(frozenset({25}), ("cde",), tail=4, decode=letters)
    m = Member(seed=0)
    m.extend(Done([0, 1, 2], [-0.1] * 3, [1.0] * 3, ABORT), 0, 10, rule)
    assert not m.done
    m.extend(Done([3, 4, 5, 6], [-0.2, -0.3, -0.4, -0.5], [2.0] * 4, {"type": "stop"}), 1, 10, rule)
    assert m.done and m.tokens == [0, 1, 2, 3, 4]
    assert m.logprobs == [-0.1] * 3 + [-0.2, -0.3] and m.versions == [0, 0, 0, 1, 1]
    assert len(m.entropy) == 5
    assert rule.end([0, 1, 2, 3]) is None and rule.end([7, 25, 9]) == 2
    assert StopRule(frozenset(), ("cde",), tail=2, decode=letters).end([2, 3, 4]) is None


@pytest.mark.parametrize(
    ("limits", "match"),
    [
        ([2, 3, 4], r"has 3 entries for 4 samples"),
        ([2, 0, 4, 1], r"max_tokens_per_sample\[1\] must be an integer in \[1, 8\]"),
        ([2, 9, 4, 1], r"max_tokens_per_sample\[1\] must be an integer in \[1, 8\]"),
        ([2, 3.0, 4, 1], r"max_tokens_per_sample\[1\] must be an integer"),
        ([True, 3, 4, 1], r"max_tokens_per_sample\[0\] must be an integer"),
    ],
)
def test_bad_per_sample_limits_raise_by_name(limits, match):
    with pytest.raises(ValueError, match=match):
        sample_limits(limits, samples=4, max_new=8)


def test_per_sample_limits_are_plain_ints_and_none_stays_none():
    assert sample_limits(np.array([1, 8, 2, 3]), 4, 8) == [1, 8, 2, 3]
    assert all(type(v) is int for v in sample_limits(np.array([1, 8]), 2, 8))
    assert sample_limits(None, 4, 8) is None


def test_paused_groups_older_than_max_staleness_are_dropped():
    def group(key, version):
        m = Member(seed=0)
        if version is not None:
            m.extend(Done([9], [0.0], [0.0], ABORT), version=version, limit=8)
        return Group(key, [1], [m, Member(seed=1)])

    paused = PausedGroups()
    paused.pause([group("old", 1), group("recent", 2), group("unstarted", None)])
    assert len(paused) == 3
    kept = paused.resume(version=3, max_staleness=1)
    assert [g.key for g in kept] == ["recent", "unstarted"] and paused.dropped == 1
    assert len(paused) == 0


@pytest.mark.parametrize(
    "args, match",
    [
        ((1, 1), "partial_rollout must be True or False"),
        ((True, -1), "max_staleness must be an integer >= 0"),
        ((True, True), "max_staleness must be an integer >= 0"),
    ],
)
def test_bad_partial_settings_raise_by_name(args, match):
    with pytest.raises(ValueError, match=match):
        _check_partial(*args, EngineSettings())


def test_partial_rollout_refuses_options_a_continuation_would_change():
    with pytest.raises(ValueError, match="return_routed_experts"):
        _check_partial(True, 1, EngineSettings(return_routed_experts=True))
    _check_partial(False, 1, EngineSettings(return_routed_experts=True))
    for name, value in (("frequency_penalty", 0.5), ("presence_penalty", 0.1)):
        with pytest.raises(ValueError, match=f"{name}={value} cannot be used with partial"):
            _check_partial_options(SamplingOptions(**{name: value}))
    with pytest.raises(ValueError, match="min_new_tokens=2"):
        _check_partial_options(SamplingOptions(min_new_tokens=2))
    _check_partial_options(SamplingOptions(repetition_penalty=1.2))
