"""The per-request stores, driven by `FakeReq`: a test double of sgl-jax's `Req` holding only
the attributes the collector reads. The collector is our code; the engine is not faked here
(the engine-marked tests in tests/sgl_jax_rollout/test_rollout.py drive the real one)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sgl_jax_rollout.engine.collector import Collector, StepValues
from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.sampling.options import SamplingOptions


@dataclasses.dataclass(eq=False)
class FakeReq:
    rid: str
    output_ids: list[int] = dataclasses.field(default_factory=list)
    finished_len: int | None = None
    finished_reason: object = None

    @property
    def output_ids_through_stop(self):
        return (
            self.output_ids if self.finished_len is None else self.output_ids[: self.finished_len]
        )

    def finished(self):
        return self.finished_reason is not None


class Reason:
    def to_json(self):
        return {"type": "stop"}


def step(collector, reqs, tokens, logprobs, entropy):
    for req, tok in zip(reqs, tokens, strict=True):
        if tok is not None:
            req.output_ids.append(tok)
    collector.stash_step(reqs, StepValues(np.asarray(logprobs), np.asarray(entropy)))
    collector.record(reqs)
    collector.end_step()


def spec(**kw):
    return RequestSpec(SamplingOptions(seed=0, **kw))


def empty(collector):
    return all(v == 0 for v in collector.sizes().values())


def test_values_follow_their_request_row_and_end_at_the_stop_token():
    c = Collector()
    a, b = FakeReq("a"), FakeReq("b")
    c.register("a", spec())
    c.register("b", spec())
    step(c, [a, b], [5, 6], [-1.0, -2.0], [0.1, 0.2])
    step(c, [b, a], [7, 8], [-3.0, -4.0], [0.3, 0.4])  # rows reordered between steps
    a.finished_len, a.finished_reason = 2, Reason()
    step(c, [a, b], [9, None], [-5.0, -6.0], [0.5, 0.6])  # a: extra token past its stop
    done = c.take("a")
    assert done.tokens == [5, 8] and done.logprobs == [-1.0, -4.0] and done.entropy == [0.1, 0.4]
    assert done.finish_reason == {"type": "stop"} and done.error is None
    b.finished_reason = Reason()
    step(c, [b], [None], [0.0], [0.0])
    assert c.take("b").tokens == [6, 7]
    assert empty(c)


def test_unregistered_requests_are_ignored():
    c = Collector()
    other = FakeReq("x")
    step(c, [other], [3], [-1.0], [0.5])
    assert empty(c)


def test_two_new_tokens_in_one_step_mark_the_request_as_broken():
    c = Collector()
    r = FakeReq("r")
    c.register("r", spec())
    r.output_ids += [1]
    step(c, [r], [2], [-1.0], [0.0])
    r.finished_reason = Reason()
    step(c, [r], [None], [0.0], [0.0])
    assert "2 new token(s)" in c.take("r").error


def test_take_without_completion_gives_none_and_forget_clears_everything():
    c = Collector()
    c.register("r", spec())
    assert c.take("r") is None and empty(c)
    c.register("s", spec())
    c.forget(["s"])
    assert empty(c)


def test_a_failed_step_ends_its_requests_with_the_error_and_records_nothing_more():
    c = Collector()
    a, b = FakeReq("a"), FakeReq("b")
    c.register("a", spec())
    c.register("b", spec())
    step(c, [a, b], [4, 5], [-1.0, -2.0], [0.1, 0.2])
    c.fail(["a", "not-ours"], "an engine step failed: ValueError: boom")
    a.finished_reason = b.finished_reason = Reason()
    step(c, [a, b], [6, 7], [-3.0, -4.0], [0.3, 0.4])  # a's later values are ignored
    failed = c.take("a")
    assert failed.error == "an engine step failed: ValueError: boom" and failed.tokens == []
    assert c.take("b").tokens == [5, 7] and c.take("not-ours") is None
    assert empty(c)


def test_a_request_id_cannot_be_registered_twice():
    c = Collector()
    c.register("r", spec())
    with pytest.raises(ValueError, match="already in use"):
        c.register("r", spec())


def test_values_not_asked_for_are_none():
    c = Collector()
    r = FakeReq("r")
    c.register("r", spec(return_logprobs=False, return_entropy=False))
    r.finished_reason = Reason()
    step(c, [r], [4], [-1.0], [0.3])
    done = c.take("r")
    assert done.tokens == [4] and done.logprobs is None and done.entropy is None


def test_registered_tells_our_requests_until_they_are_taken():
    c = Collector()
    c.register("a", spec())
    c.register("b", spec())
    b = FakeReq("b", finished_reason=Reason())
    step(c, [b], [5], [-0.5], [1.0])  # b finishes: its completion waits to be taken
    assert c.registered(["a", "b", "x"]) == [True, True, False]
    c.take("b")
    assert c.registered(["a", "b"]) == [True, False]


class Abort:
    def to_json(self):
        return {"type": "abort", "message": "Aborted"}


def test_group_watch_resolves_with_the_first_groups_whose_every_request_finished():
    """A group completes when its last request finishes; an aborted request keeps its group
    from completing; the future holds the first `need` groups in completion order."""
    c = Collector()
    reqs = {rid: FakeReq(rid) for rid in ["a0", "a1", "b0", "b1", "c0", "c1"]}
    for rid in reqs:
        c.register(rid, spec())
    watch = c.watch_groups({rid: "abc".index(rid[0]) for rid in reqs}, need=2)
    future = watch.future

    def finish(rid, reason=Reason):
        req = reqs[rid]
        req.finished_reason = reason()
        step(c, [req], [7], [-0.5], [0.1])

    finish("a0")
    finish("b0", Abort)  # group 1 can no longer complete
    finish("b1")
    finish("c0")
    assert not future.done()
    assert c.finished("a0") and not c.finished("a1")
    finish("c1")
    assert not future.done()
    finish("a1")
    assert future.result(timeout=0) == [2, 0]
    c.unwatch(watch)
    c.forget(reqs)
    assert empty(c)


def test_the_group_watches_of_two_calls_running_together_see_only_their_own_requests():
    """Two calls (threads) watch their groups at once: each watch completes from its own
    requests, judges with its own `accept`, and leaves nothing behind when unwatched."""
    c = Collector()
    reqs = {rid: FakeReq(rid) for rid in ["x0", "x1", "y0", "y1"]}
    for rid in reqs:
        c.register(rid, spec())
    judged = []
    first = c.watch_groups({"x0": 0, "x1": 1}, need=1)
    second = c.watch_groups(
        {"y0": 0, "y1": 1}, need=1, accept=lambda g, done: judged.append(g) or g == 1
    )
    with pytest.raises(ValueError, match="already watched"):
        c.watch_groups({"x0": 5}, need=1)
    for rid in ["y0", "x1", "y1"]:
        reqs[rid].finished_reason = Reason()
        step(c, [reqs[rid]], [7], [-0.5], [0.1])
    assert first.future.result(timeout=0) == [1]
    assert c.judge_groups(first) == []  # no accept: nothing to judge
    assert c.judge_groups(second) == [1] and judged == [0, 1]
    assert second.future.result(timeout=0) == [1]
    for watch in (first, second):
        c.unwatch(watch)
    c.forget(reqs)
    assert empty(c)
