"""Scheduling fixes (`patches/scheduling.py`) around upstream calls, driven with test
doubles of the upstream side (a stub `original` that records what upstream would receive, a
stub detokenizer holding only `decode_status`, a stub running batch whose `filter_batch` drops
finished requests, or keeps the indices given, as upstream's does, a stub worker holding only
the queue upstream's `ModelWorker.__init__` makes, and a stub capturer): the code under test
is our wrapper; the live engine runs all of them in every engine test
(`test_rollout.py::test_a_call_is_prefilled_as_one_batch` checks the admission one,
`test_overlap_engine.py` the steps of a call with overlap on)."""

from __future__ import annotations

import types

import pytest

pytestmark = pytest.mark.engine  # needs sgl-jax importable (no engine is started)


@pytest.fixture()
def hooks():
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.engine.collector import Collector

    active = patches.EngineHooks(collector=Collector(), valid_vocab_size=None)
    patches.activate(active, wait_s=0)
    yield active
    patches.deactivate(active)


def test_the_detokenizer_gets_only_the_last_id_of_our_requests(hooks):
    from sgl_jax_rollout.engine.patches import scheduling
    from sgl_jax_rollout.engine.rows import RequestSpec
    from sgl_jax_rollout.sampling.options import SamplingOptions

    hooks.collector.register("ours-running", RequestSpec(SamplingOptions(seed=0)))
    hooks.collector.register("ours-done", RequestSpec(SamplingOptions(seed=1)))
    hooks.collector._done["ours-done"] = hooks.collector._specs.pop("ours-done")  # finished
    detokenizer = types.SimpleNamespace(decode_status={"old": "state"})
    recv = types.SimpleNamespace(
        rids=["ours-running", "ours-done", "theirs"],
        decode_ids=[[1, 2, 3], [4, 5, 6, 7], [8, 9]],
        finished_reasons=[None, {"type": "stop", "matched": 7}, {"type": "length"}],
    )
    seen = {}

    def original(self, recv_obj):
        seen["decode_ids"] = [list(ids) for ids in recv_obj.decode_ids]
        for rid in recv_obj.rids:
            self.decode_status[rid] = "state"
        return "out"

    assert scheduling._detokenize(original, detokenizer, recv) == "out"
    # ours: the last id only (stop trimming needs one); theirs: untouched
    assert seen["decode_ids"] == [[3], [7], [8, 9]]
    # finished requests' states are dropped, running ones kept
    assert set(detokenizer.decode_status) == {"old", "ours-running"}
    assert hooks.detokenizer_states == 2


@pytest.mark.parametrize("waiting", [False, True])
def test_finished_requests_leave_the_running_batch_before_admission(hooks, waiting):
    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.patches import scheduling

    def req(finished):
        return types.SimpleNamespace(finished=lambda: finished)

    running, done = req(False), req(True)
    ranks = [  # rank 0: full, one request finished; rank 1: nothing finished
        upstream.get("ScheduleReqsInfo")(reqs=[done, running], batch_is_full=True),
        upstream.get("ScheduleReqsInfo")(reqs=[req(False)], batch_is_full=True),
    ]

    def filter_batch():  # as upstream's: keeps the requests not finished
        for info in ranks:
            info.reqs = [r for r in info.reqs if not r.finished()]

    batch = types.SimpleNamespace(reqs_info=ranks, filter_batch=filter_batch)
    scheduler = types.SimpleNamespace(
        running_batch=batch, waiting_queue=["new"] if waiting else [], _sgl_jax_rollout_hooks=hooks
    )
    seen = {}

    def original(self):
        seen["sizes"] = [len(info.reqs) for info in self.running_batch.reqs_info]
        seen["full"] = [info.batch_is_full for info in self.running_batch.reqs_info]
        return "prefill"

    assert scheduling._finished_leave_first(original, scheduler) == "prefill"
    if waiting:  # admission sees the finished request gone and its rank no longer full
        assert seen == {"sizes": [1, 1], "full": [False, True]}
        assert ranks[0].reqs == [running]
    else:  # nothing to admit: upstream's own order, untouched
        assert seen == {"sizes": [2, 1], "full": [True, True]}


@pytest.mark.parametrize("overlap", [False, True])
def test_requests_whose_token_in_flight_is_their_last_by_length_get_no_step_after_it(
    hooks, overlap
):
    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.patches import scheduling

    def req(outputs, max_new_tokens, finished=False):
        return types.SimpleNamespace(
            output_ids=[0] * outputs,
            sampling_params=types.SimpleNamespace(max_new_tokens=max_new_tokens),
            finished=lambda: finished,
        )

    last = req(3, 4)  # in flight: its 4th token of 4
    early = req(1, 4)  # in flight: 2nd of 4
    waited = req(3, 4)  # not in the step in flight (its 3rd token was processed): 4th to come
    last_other_rank = req(0, 1)  # in flight: a prefill's first and only token
    ranks = [
        upstream.get("ScheduleReqsInfo")(reqs=[last, early, waited], batch_is_full=True),
        upstream.get("ScheduleReqsInfo")(reqs=[last_other_rank], batch_is_full=True),
    ]
    kept = {}

    def filter_batch(keep_indices):  # as upstream's with keep_indices: per rank
        kept.update(keep_indices)
        for rank, info in enumerate(ranks):
            info.reqs = [info.reqs[i] for i in keep_indices[rank]]

    batch = types.SimpleNamespace(reqs_info=ranks, filter_batch=filter_batch)
    launched = types.SimpleNamespace(
        reqs_info=[
            types.SimpleNamespace(reqs=[last, early]),
            types.SimpleNamespace(reqs=[last_other_rank]),
        ]
    )
    scheduler = types.SimpleNamespace(_sgl_jax_rollout_hooks=hooks)
    if overlap:  # upstream's overlap loop: the step launched last, not processed yet
        scheduler.result_queue = [(launched, "result")]
    seen = {}

    def original(self, batch):
        seen["reqs"] = [list(info.reqs) for info in batch.reqs_info]
        seen["full"] = [info.batch_is_full for info in batch.reqs_info]
        return "running"

    assert scheduling._no_step_after_the_last(original, scheduler, batch) == "running"
    if overlap:
        assert kept == {0: [1, 2], 1: []}
        assert seen == {"reqs": [[early, waited], []], "full": [False, False]}
    else:  # without overlap every token is processed before the next step: untouched
        assert kept == {}
        assert seen == {"reqs": [[last, early, waited], [last_other_rank]], "full": [True, True]}


def test_expert_ids_reach_the_sync_thread_only_while_a_capturer_records_them(monkeypatch):
    import queue

    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.patches import scheduling

    capturers = upstream.module("layers.routed_experts_capturer")
    worker = types.SimpleNamespace()

    def original(self):  # upstream's __init__, as far as the queue goes
        self.sync_queue = queue.Queue()

    scheduling._expert_ids_sync_when_captured(original, worker)
    step = (["topk ids"], "model worker batch")

    monkeypatch.setattr(
        capturers, "_global_expert_capturer", upstream.get("RoutedExpertsCapturerNoop")()
    )
    worker.sync_queue.put(step)
    assert worker.sync_queue.qsize() == 0  # nothing records them: the sync thread stays asleep

    monkeypatch.setattr(capturers, "_global_expert_capturer", types.SimpleNamespace())  # records
    worker.sync_queue.put(step)
    assert worker.sync_queue.get_nowait() == step
