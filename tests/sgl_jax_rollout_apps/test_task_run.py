"""`TaskRun`'s steps (sgl_jax_rollout_apps/task_run.py): a step's batch against dynamic
sampling's extra batches, evaluation on the step's weights, per-step times and phases.

The cluster here is a test double, and it says so: these tests are about `TaskRun`'s own
bookkeeping, which reads only the cluster's `global_steps` (tunix moves it at each weight sync)
and wraps its methods. The learner's pulls are replayed in tunix's order: the first batch at
`train()`'s start, dynamic sampling's draws during the step's rounds, the next step's batch
after the sync. The engine run of the same path is `demo --task` (issue note, docs/guide.md).
"""

from __future__ import annotations

import time

import pytest

from sgl_jax_rollout_apps import tasks
from sgl_jax_rollout_apps.demo import DemoConfig
from sgl_jax_rollout_apps.task_run import TaskRun


class _ClusterDouble:
    """Test double of a RolloutCluster: a tokenizer, tunix's step counter, the timed methods."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.rollout = object()
        self.global_steps = 0
        self.cluster_config = None

    def generate(self, prompts):
        return prompts

    def generate_groups(self, prompts):
        time.sleep(0.02)
        return prompts

    def get_actor_per_token_logps(self):
        return None

    def update_actor(self):
        return None

    def sync_weights(self):
        self.global_steps += 1  # what tunix's RLCluster.sync_weights does


@pytest.fixture
def task_run(monkeypatch):
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tiny_model import default_model_dir

    cluster = _ClusterDouble(AutoTokenizer.from_pretrained(default_model_dir()))
    evaluated_at: list[int] = []

    def evaluate(rollout, prompts, answers, config, rows_per_call, show_progress, style):
        assert rollout is cluster.rollout and len(prompts) == len(answers) == 8
        evaluated_at.append(cluster.global_steps)  # the weights the evaluation sees
        return 0.25 * len(evaluated_at)

    monkeypatch.setattr(tasks, "evaluate", evaluate)
    config = DemoConfig(
        task="arithmetic",
        steps=3,
        prompts_per_step=2,
        eval_every=2,
        eval_problems=8,
        filter_groups="verl",
        over_sampling_batch_size=4,
        show_progress=False,
    )
    return TaskRun(config, cluster, rollout_config=None), cluster, evaluated_at


def _answers(batch) -> list[str]:
    return [str(a) for a in batch["answer"]]


def test_draws_between_syncs_are_the_same_step_and_the_stream_goes_on(task_run):
    run, cluster, evaluated_at = task_run
    stream = tasks.task("arithmetic").problems(
        12, seed=run.config.seed, exclude=tasks.task("arithmetic").held_out(8, run.config.seed)
    )
    batches = run.batches()
    taken = [next(batches)]  # tunix's first pull, at train() start: step 0
    cluster.generate_groups(["p"])  # the step's first round
    taken += [next(batches), next(batches)]  # dynamic sampling draws twice for step 0
    cluster.sync_weights()
    taken.append(next(batches))  # step 1, no draw
    cluster.sync_weights()
    taken.append(next(batches))  # step 2
    taken.append(next(batches))  # a draw for step 2
    cluster.sync_weights()
    with pytest.raises(StopIteration):  # steps=3 have synced: the data ends
        next(batches)
    run.finish()

    assert run.extra_batches == [2, 0, 1]
    assert len(run.step_seconds) == len(run.step_phases) == 3
    assert [e["step"] for e in run.evals] == [0, 2, 3]
    assert evaluated_at == [0, 2, 3]  # each on the weights of the step it names
    assert run.step_phases[0]["rollout_s"] >= 0.02  # generate_groups is rollout time
    assert run.step_phases[1]["rollout_s"] == 0
    # every batch, step or draw, is the next prompts of one stream, none held out
    assert sum((_answers(b) for b in taken), []) == [p.answer for p in stream]
    for batch, problems in zip(taken, [stream[i : i + 2] for i in range(0, 12, 2)], strict=True):
        for prompt, problem in zip(batch["prompts"], problems, strict=True):
            assert prompt.endswith(
                f"<|im_start|>user\n{problem.question}<|im_end|>\n<|im_start|>assistant\n"
            )
    summary = run.summary()
    assert summary["accuracy_before"] == 0.25 and summary["accuracy_after"] == 0.75


def test_without_draws_step_k_trains_on_the_streams_kth_batch(task_run):
    run, cluster, evaluated_at = task_run
    cluster.global_steps = 5  # a learner resumed at step 5: steps count from the first batch
    stream = tasks.task("arithmetic").problems(
        6, seed=run.config.seed, exclude=tasks.task("arithmetic").held_out(8, run.config.seed)
    )
    batches = run.batches()
    for step in range(3):
        assert _answers(next(batches)) == [p.answer for p in stream[2 * step : 2 * step + 2]]
        cluster.sync_weights()
    with pytest.raises(StopIteration):
        next(batches)
    run.finish()
    assert run.extra_batches == [0, 0, 0] and evaluated_at == [5, 7, 8]
    assert [e["step"] for e in run.evals] == [0, 2, 3]


def test_an_agentic_run_draws_questions_and_counts_the_producers_head_start(task_run):
    """tunix's agentic learner with `off_policy_steps` 1 takes two batches before the first
    sync: the second is the next step's, drawn early (an extra batch of step 0 here, as a
    dynamic-sampling draw), and every batch holds the bare questions (its agent writes the
    chat); the rollout's time is no phase of an agentic step."""
    import dataclasses

    _, cluster, _ = task_run
    config = DemoConfig(
        task="arithmetic",
        steps=2,
        prompts_per_step=2,
        eval_every=2,
        eval_problems=8,
        learner="agentic",
        off_policy_steps=1,
        show_progress=False,
    )
    run = TaskRun(dataclasses.replace(config), cluster, rollout_config=None)
    batches = run.batches()
    first, ahead = next(batches), next(batches)  # the prompt queue's head start
    cluster.sync_weights()
    later = next(batches)  # the learner's pull after step 0's sync
    cluster.sync_weights()
    with pytest.raises(StopIteration):  # steps=2 have synced: the data ends
        next(batches)
    run.finish()
    stream = tasks.task("arithmetic").problems(
        6, seed=0, exclude=tasks.task("arithmetic").held_out(8, 0)
    )
    drawn = [*first["prompts"], *ahead["prompts"], *later["prompts"]]
    assert drawn == [p.question for p in stream]
    assert run.extra_batches == [1, 0] and "rollout_s" not in run.step_phases[0]
    assert "rollout_s" not in run.summary()["phases_median_s"]
