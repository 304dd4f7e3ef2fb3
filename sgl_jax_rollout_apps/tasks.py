"""Real tasks for `demo --task NAME`: procedurally generated problems with a verifiable reward.

Owns `Task` and `TASKS`, the held-out evaluation (`evaluate`: greedy accuracy through whichever
rollout the run trains with, on the weights it holds) and the significance of a change in
accuracy (`two_proportion_p`). A task gives each problem as a chat prompt in the model's own
chat template, its answer as a dataset column (tunix hands it to the reward by name), and a
reward of 1.0 exactly when the answer is right.

- `arithmetic`: "a + b =" with a, b in [0, 20], under the system message "You are a calculator.
  Reply with the result only."; reward 1.0 when the last integer of the completion is a + b.
  Untrained SmolLM2-135M-Instruct often writes "The answer is 11." for any sum, and right sums
  when it writes the equation out: greedy accuracy is far from 0 and far from 1, and a policy
  that learns to show the equation gains most of the rest.

The held-out problems are distinct questions drawn first from their own seeded stream; training
problems come from another stream and never ask a held-out question.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

_INTEGER = re.compile(r"-?\d+")


@dataclasses.dataclass(frozen=True)
class Problem:
    question: str
    answer: str


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    system: str
    operand_range: tuple[int, int]  # inclusive

    def problem(self, rng: np.random.Generator) -> Problem:
        low, high = self.operand_range
        a, b = (int(x) for x in rng.integers(low, high + 1, size=2))
        return Problem(f"{a} + {b} =", str(a + b))

    def problems(self, count: int, seed: int, exclude: Sequence[Problem] = ()) -> list[Problem]:
        """The first `count` problems of `stream(seed, exclude)`."""
        return list(itertools.islice(self.stream(seed, exclude), count))

    def stream(self, seed: int, exclude: Sequence[Problem] = ()) -> Iterator[Problem]:
        """Training problems without end (repeats allowed) from the stream of `seed`, none of
        them a question of `exclude` (the held-out set)."""
        rng = np.random.default_rng(seed)
        excluded = {p.question for p in exclude}
        while True:
            p = self.problem(rng)
            if p.question not in excluded:
                yield p

    def held_out(self, count: int, seed: int) -> list[Problem]:
        """`count` distinct problems from a stream of their own (seed + 1,000,003)."""
        low, high = self.operand_range
        if count > (high - low + 1) ** 2 // 2:
            raise ValueError(
                f"eval problems must be at most half of the task's {(high - low + 1) ** 2} "
                f"questions (the rest is for training), got {count}"
            )
        rng = np.random.default_rng(seed + 1_000_003)
        seen: dict[str, Problem] = {}
        while len(seen) < count:
            p = self.problem(rng)
            seen.setdefault(p.question, p)
        return list(seen.values())

    def prompt(self, tokenizer: Any, problem: Problem) -> str:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": problem.question},
        ]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def reward(
        self, prompts: Sequence[Any], completions: Sequence[str], answer: Sequence[Any], **_: Any
    ) -> list[float]:
        """tunix's reward shape: 1.0 where the completion's last integer is the answer."""
        return [float(is_correct(c, str(a))) for c, a in zip(completions, answer, strict=True)]


def is_correct(completion: str, answer: str) -> bool:
    numbers = _INTEGER.findall(completion)
    return bool(numbers) and numbers[-1] == answer


TASKS = {
    "arithmetic": Task(
        name="arithmetic",
        system="You are a calculator. Reply with the result only.",
        operand_range=(0, 20),
    )
}


def task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name]


def evaluate(
    rollout: Any,
    prompts: list[str],
    answers: list[str],
    config: Any,
    rows_per_call: int,
    show_progress: bool = False,
) -> float:
    """Greedy accuracy of `rollout` on the held-out prompts (`config`: a `RolloutConfig` for
    lengths), `rows_per_call` prompts per call: the training batch's rows, so neither rollout
    meets a new shape (and the engine prefills each call at once instead of admitting a few
    requests at a time into a running batch). Greedy for both rollouts: temperature 0 for ours
    (a per-call option), no top-p and no top-k for tunix's vanilla sampler (which takes no
    per-call options). `show_progress`: a bar of problems on stderr, gone when done."""
    from tqdm import tqdm

    greedy = dataclasses.replace(config, top_p=None, top_k=None)
    texts: list[str] = []
    bar = tqdm(
        total=len(prompts),
        desc="held-out eval",
        unit="problem",
        file=sys.stderr,
        leave=False,
        disable=not show_progress,
    )
    with bar:
        for start in range(0, len(prompts), rows_per_call):
            chunk = prompts[start : start + rows_per_call]
            texts += rollout.generate(chunk, greedy, temperature=0.0).text
            bar.update(len(chunk))
    return float(np.mean([is_correct(t, a) for t, a in zip(texts, answers, strict=True)]))


def two_proportion_p(before: float, after: float, n_before: int, n_after: int) -> float:
    """Two-sided p-value of the two-proportion z-test (pooled) for accuracies on n problems."""
    pooled = (before * n_before + after * n_after) / (n_before + n_after)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_before + 1 / n_after))
    if se == 0:
        return 1.0 if after == before else 0.0
    return math.erfc(abs(after - before) / se / math.sqrt(2))
