"""What `demo --task NAME` adds to a demo run: the task's batches, held-out evaluation between
steps, where each step's time goes, and the two-rollout comparison with its plot.

Owns `TaskRun`. Its `batches` generator is what the learner trains on: batches of
`prompts_per_step` of the task's prompts (in the style `tasks.prompt_style` picks), drawn in
order from the task's endless training stream, with their answers as a dataset column. Step k's
batch is the first one tunix takes once k steps have synced their weights (the cluster's
`global_steps` moved k times since the first batch; tunix moves it at each sync): before it, the
held-out greedy accuracy is measured at steps 0, `eval_every`, 2 x `eval_every`, ..., through
the run's own rollout on the weights it holds then. Batches taken before the next sync are
dynamic sampling's extra prompts for the same step (`filter_groups`, over-sampling, partial
rollouts draw them from the data iterator, as verl's DAPO trainer draws from its dataloader):
they start no step and no evaluation. `finish` measures the accuracy once more after the last
step. Wall time per step is the time between two steps' batches less the evaluation between
them; `phases` splits it (rollout, with dynamic sampling's rounds; trainer scoring; actor
update; weight sync) by timing the cluster's own methods. `compare` runs the same task with each
rollout on the same seeds and writes `summary.json` and `task.png` (held-out accuracy, reward
mean and wall time per step).

With tunix's agentic learner (`demo --learner agentic`) the batches hold the questions alone
(the learner's agent writes the chat), the rollout's time is no phase (its episodes may run
while the trainer updates), and with a tool the held-out evaluation runs whole greedy tool
episodes (`agentic_demo.tool_accuracy`: accuracy and the share that called the tool).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout_apps import tasks

log = logging.getLogger(__name__)
PHASES = {
    "rollout_s": ("generate", "generate_groups"),
    "trainer_scoring_s": ("get_actor_per_token_logps",),
    "actor_update_s": ("update_actor",),
    "weight_sync_s": ("sync_weights",),
}


class TaskRun:
    def __init__(self, config: Any, cluster: Any, rollout_config: Any) -> None:
        self.config = config
        self.task = tasks.task(config.task)
        self.cluster = cluster
        self.rollout_config = rollout_config
        tokenizer = cluster.tokenizer
        self.style = tasks.prompt_style(config.prompt_style, tokenizer)
        shots = self.task.examples() if self.style == "few-shot" else ()
        held_out = self.task.held_out(config.eval_problems, config.seed, exclude=shots)
        self._eval_prompts = [self.task.prompt(tokenizer, p, self.style) for p in held_out]
        self._eval_questions = [p.question for p in held_out]
        self._eval_answers = [p.answer for p in held_out]
        # the agentic learner renders its chats itself, and samples while the trainer updates
        self._agentic = config.learner == "agentic"
        self._phases = {k: v for k, v in PHASES.items() if not (self._agentic and k == "rollout_s")}
        self._tokenizer = tokenizer
        if config.tools:  # each turn's prompt is the chat as text, longer than the first
            from sgl_jax_rollout_apps import agentic_demo

            first = agentic_demo.first_prompt_tokens(config, agentic_demo.hf_tokenizer(cluster))
            turn = agentic_demo.turn_prompt_tokens(config, first)
            self._tool_turns = dataclasses.replace(rollout_config, max_prompt_length=turn)
        self._train = self.task.stream(config.seed, exclude=held_out)
        self.extra_batches: list[int] = []  # per step: batches dynamic sampling drew
        self.evals: list[dict[str, float]] = []
        self.step_seconds: list[float] = []
        self.step_phases: list[dict[str, float]] = []
        self._totals = dict.fromkeys(self._phases, 0.0)
        self._eval_seconds_since_last = 0.0
        self._last_batch = time.perf_counter()
        self._time_phases()

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        per_step, step, synced = self.config.prompts_per_step, -1, None
        while True:
            # tunix takes step k's batch once step k - 1 has trained and synced its weights
            # (counted from the first batch: a resumed learner starts at its restored step)
            if self.cluster.global_steps != synced:
                synced, step = self.cluster.global_steps, step + 1
                if step >= self.config.steps:
                    return
                if step % self.config.eval_every == 0:
                    self._evaluate(step)
                if step:
                    self._close_step()
                self.extra_batches.append(0)
                self._last_batch = time.perf_counter()
                self._eval_seconds_since_last = 0.0  # evaluations before the batch are no step's
            else:
                self.extra_batches[-1] += 1
                log.info(
                    "step %d: another %d prompts before the next weight sync (dynamic sampling, "
                    "or an agentic producer running ahead)",
                    step,
                    per_step,
                )
            problems = [next(self._train) for _ in range(per_step)]
            if self._agentic:  # the question alone: the learner's agent writes the chat
                prompts = [p.question for p in problems]
            else:
                prompts = [self.task.prompt(self._tokenizer, p, self.style) for p in problems]
            yield {"prompts": np.array(prompts), "answer": np.array([p.answer for p in problems])}

    def finish(self) -> None:
        """After the learner returns: the last step's time and the final evaluation."""
        self._close_step()
        self._evaluate(self.config.steps)

    def _close_step(self) -> None:
        """The step since the last batch was handed out, less the evaluation after it."""
        seconds = time.perf_counter() - self._last_batch - self._eval_seconds_since_last
        self.step_seconds.append(round(seconds, 3))
        self.step_phases.append({name: round(t, 3) for name, t in self._totals.items()})
        self._totals = dict.fromkeys(self._phases, 0.0)
        self._eval_seconds_since_last = 0.0

    def _evaluate(self, step: int) -> None:
        start = time.perf_counter()
        rows = self.config.prompts_per_step * self.config.num_generations
        if self.config.tools:  # whole tool episodes, greedy
            from sgl_jax_rollout_apps.agentic_demo import tool_accuracy

            scores = tool_accuracy(
                self.cluster.rollout,
                self._tokenizer,
                self._eval_questions,
                self._eval_answers,
                self._tool_turns,
                self.config.max_tokens,
                rows,
            )
        else:
            accuracy = tasks.evaluate(
                self.cluster.rollout,
                self._eval_prompts,
                self._eval_answers,
                self.rollout_config,
                rows,
                show_progress=self.config.show_progress,
                style=self.style,
            )
            scores = {"accuracy": accuracy}
        accuracy = scores["accuracy"]
        seconds = time.perf_counter() - start
        self._eval_seconds_since_last += seconds
        self.evals.append({"step": step, **scores, "seconds": round(seconds, 2)})
        log.info("held-out accuracy at step %d: %.3f (%.0f s)", step, accuracy, seconds)
        if self.config.show_progress:
            print(
                f"held-out greedy accuracy after {step} steps: {accuracy:.3f} "
                f"({len(self._eval_prompts)} problems, {seconds:.0f} s)",
                flush=True,
            )

    def _time_phases(self) -> None:
        """Times the cluster's own methods (instance attributes over the class's); a cluster
        without dynamic sampling has no `generate_groups`."""
        for phase, names in self._phases.items():
            for name in names:
                original = getattr(self.cluster, name, None)
                if original is None:
                    continue

                def timed(*args, _original=original, _phase=phase, **kwargs):
                    start = time.perf_counter()
                    try:
                        return _original(*args, **kwargs)
                    finally:
                        self._totals[_phase] += time.perf_counter() - start

                setattr(self.cluster, name, timed)

    def summary(self) -> dict[str, Any]:
        n = len(self._eval_prompts)
        first, last = self.evals[0]["accuracy"], self.evals[-1]["accuracy"]
        steady = self.step_seconds[1:] or self.step_seconds
        return {
            "task": self.config.task,
            "rollout": self.config.rollout,
            "eval_problems": n,
            "accuracy_before": first,
            "accuracy_after": last,
            "gain_points": round(100 * (last - first), 1),
            "p_value": tasks.two_proportion_p(first, last, n, n),
            "step_seconds_median": float(np.median(steady)),
            "first_step_seconds": self.step_seconds[0],
            "phases_median_s": {
                phase: float(
                    np.median([p[phase] for p in self.step_phases[1:] or self.step_phases])
                )
                for phase in self._phases
            },
            **(
                {
                    "tool_call_share_before": self.evals[0]["tool_call_share"],
                    "tool_call_share_after": self.evals[-1]["tool_call_share"],
                }
                if "tool_call_share" in self.evals[0]
                else {}
            ),
            "evals": self.evals,
        }

    def write(self, out: Path, history: list[dict[str, float]]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        steps = zip(history, self.step_seconds, self.step_phases, self.extra_batches, strict=False)
        for row, seconds, phases, extra in steps:
            row.update(step_seconds=seconds, extra_batches=extra, **phases)
        with open(out / "eval.jsonl", "w") as f:
            for row in self.evals:
                f.write(json.dumps(row) + "\n")
        (out / "summary.json").write_text(json.dumps(self.summary(), indent=2) + "\n")


def compare(config: Any, run_one) -> dict[str, Any]:
    """`run_one(config)` -> (history, summary) for each rollout, on the same seeds; writes
    `summary.json` and `task.png` to `config.out` and returns the summary."""
    from sgl_jax_rollout_apps.plotting import task_curves

    out = Path(config.out)
    runs, summaries = {}, {}
    for rollout in ("sglang_jax", "vanilla"):
        one = dataclasses.replace(config, rollout=rollout, out=str(out / rollout))
        history, summary = run_one(one)
        runs[rollout] = (history, summary["evals"])
        summaries[rollout] = summary
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    task_curves(runs, out / "task.png", f"GRPO on {config.task} ({config.steps} steps)")
    return summaries
