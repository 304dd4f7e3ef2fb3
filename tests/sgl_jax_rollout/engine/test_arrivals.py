"""Arrivals: a call is incomplete from its first received request until its last, or until the
call is forgotten; calls are tracked apart, and messages of other requests change nothing.
(The engine side, one prefill per call: test_rollout.py::test_a_call_is_prefilled_as_one_batch.)"""

from sgl_jax_rollout.engine.arrivals import Arrivals


def test_a_call_is_incomplete_between_its_first_and_last_arrival():
    arrivals = Arrivals()
    arrivals.expect(["a", "b", "c"])
    assert not arrivals.incomplete()  # nothing of it arrived: nothing to hold
    arrivals.received(["a", "someone-else"])
    assert arrivals.incomplete()
    arrivals.received(["c"])
    assert arrivals.incomplete()
    arrivals.received(["b"])
    assert not arrivals.incomplete()
    arrivals.received(["a"])  # an abort of an arrived request, say
    assert not arrivals.incomplete()


def test_calls_are_tracked_apart_and_a_forgotten_call_is_not_waited_for():
    arrivals = Arrivals()
    arrivals.expect(["a1", "a2"])
    arrivals.expect(["b1", "b2"])
    arrivals.received(["a1", "b1", "b2"])
    assert arrivals.incomplete()  # call a still lacks a2
    arrivals.forget(["a1", "a2"])  # call a failed before sending a2
    assert not arrivals.incomplete()
    arrivals.received(["a2"])  # late: no longer expected
    assert not arrivals.incomplete()
    arrivals.expect(["c1", "c2"])
    arrivals.received(["c1"])
    arrivals.forget(["c1", "c2"])
    assert not arrivals.incomplete()


def test_a_call_sent_from_another_thread_is_in_transit_until_a_request_arrives():
    arrivals = Arrivals()
    assert not arrivals.in_transit(60.0)
    arrivals.expect(["a1", "a2"])
    assert arrivals.in_transit(60.0)
    assert not arrivals.in_transit(0.0)  # sent longer ago than the wait: not waited for
    arrivals.received(["a1"])
    assert not arrivals.in_transit(60.0) and arrivals.incomplete()
    arrivals.expect(["b1"])
    arrivals.forget(["b1"])  # its submission failed before anything arrived
    assert not arrivals.in_transit(60.0)
