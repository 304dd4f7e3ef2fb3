"""Real tasks for `demo --task NAME`: procedurally generated problems with a verifiable reward.

Owns `Task` and `TASKS`, the prompt styles (`prompt_style`, `stop_ids`), the held-out
evaluation (`evaluate`: greedy accuracy through whichever rollout the run trains with, on the
weights it holds) and the significance of a change in accuracy (`two_proportion_p`). A task
gives each problem as a prompt, its answer as a dataset column (tunix hands it to the reward
by name), and a reward of 1.0 exactly when the answer is right.

Two prompt styles (`PROMPT_STYLES`; "auto", the default, is "chat" where the tokenizer has a
chat template, else "few-shot"):
- "chat": the task's system message and the question in the model's own chat template; the
  completion's last integer is its answer.
- "few-shot", for a pretrained checkpoint (Gemma 3 270M has no chat template): `SHOTS` solved
  problems, one per line ("3 + 4 = 7"), then the question; generation stops at a newline
  token (`stop_ids`) and the answer is the last integer of the completion's first line, as
  lm-evaluation-harness reads a few-shot completion up to "\n". The solved problems are the
  same in every prompt and never a held-out question.

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
PROMPT_STYLES = ("auto", "chat", "few-shot")
SHOTS = 4
_EXAMPLES_SEED = 7


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

    def held_out(self, count: int, seed: int, exclude: Sequence[Problem] = ()) -> list[Problem]:
        """`count` distinct problems from a stream of their own (seed + 1,000,003), none of
        them a question of `exclude` (a few-shot prompt's solved problems)."""
        low, high = self.operand_range
        if count > (high - low + 1) ** 2 // 2:
            raise ValueError(
                f"eval problems must be at most half of the task's {(high - low + 1) ** 2} "
                f"questions (the rest is for training), got {count}"
            )
        rng = np.random.default_rng(seed + 1_000_003)
        excluded = {p.question for p in exclude}
        seen: dict[str, Problem] = {}
        while len(seen) < count:
            p = self.problem(rng)
            if p.question not in excluded:
                seen.setdefault(p.question, p)
        return list(seen.values())

    def examples(self) -> list[Problem]:
        """The few-shot prompt's solved problems: the first `SHOTS` distinct questions of a
        stream of their own, the same for every run and seed."""
        rng = np.random.default_rng(_EXAMPLES_SEED)
        seen: dict[str, Problem] = {}
        while len(seen) < SHOTS:
            p = self.problem(rng)
            seen.setdefault(p.question, p)
        return list(seen.values())

    def prompt(self, tokenizer: Any, problem: Problem, style: str = "chat") -> str:
        """The problem's prompt in `style` ("chat" or "few-shot", `prompt_style`'s answer)."""
        if style == "few-shot":
            solved = "".join(f"{p.question} {p.answer}\n" for p in self.examples())
            return solved + problem.question
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": problem.question},
        ]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def reward_fn(self, style: str = "chat"):
        """tunix's reward function for prompts in `style`: 1.0 where the completion's answer
        (`is_correct`) is the problem's."""
        first_line = style == "few-shot"

        def reward(
            prompts: Sequence[Any], completions: Sequence[str], answer: Sequence[Any], **_: Any
        ) -> list[float]:
            pairs = zip(completions, answer, strict=True)
            return [float(is_correct(c, str(a), first_line)) for c, a in pairs]

        return reward


def is_correct(completion: str, answer: str, first_line: bool = False) -> bool:
    """Whether the last integer of the completion (of its first line, with `first_line`) is
    `answer`."""
    if first_line:
        completion = completion.split("\n", 1)[0]
    numbers = _INTEGER.findall(completion)
    return bool(numbers) and numbers[-1] == answer


class PromptStyleError(ValueError):
    """A prompt style the checkpoint's tokenizer cannot give (raised before the engine starts)."""


def check_prompt_style(requested: str) -> None:
    """PromptStyleError unless `requested` is one of `PROMPT_STYLES`."""
    if requested not in PROMPT_STYLES:
        raise PromptStyleError(f"prompt_style must be one of {PROMPT_STYLES}, got {requested!r}")


def prompt_style(requested: str, tokenizer: Any) -> str:
    """The prompt style to use, "chat" or "few-shot": `requested`, where "auto" is "chat" when
    the tokenizer has a chat template; PromptStyleError for a style not in `PROMPT_STYLES` or
    for "chat" without a template."""
    check_prompt_style(requested)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if requested == "chat" and not has_template:
        raise PromptStyleError(
            "prompt_style 'chat' needs a tokenizer with a chat template, and this checkpoint's "
            "has none (a pretrained model): use 'few-shot' (or 'auto')"
        )
    if requested == "auto":
        return "chat" if has_template else "few-shot"
    return requested


def stop_ids(tokenizer: Any, style: str) -> list[int]:
    """The token ids that end a completion in `style`: none for "chat" (the model's EOS ends
    it), for "few-shot" the tokenizer's single-token encodings of one and of two newlines."""
    if style != "few-shot":
        return []
    encodings = (tokenizer.encode(text, add_special_tokens=False) for text in ("\n", "\n\n"))
    return sorted({ids[0] for ids in encodings if len(ids) == 1})


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
    style: str = "chat",
) -> float:
    """Greedy accuracy of `rollout` on the held-out prompts (`config`: a `RolloutConfig` for
    lengths), `rows_per_call` prompts per call: the training batch's rows, so neither rollout
    meets a new shape (and the engine prefills each call at once instead of admitting a few
    requests at a time into a running batch). Greedy for both rollouts: temperature 0 for ours
    (a per-call option), no top-p and no top-k for tunix's vanilla sampler (which takes no
    per-call options). `show_progress`: a bar of problems on stderr, gone when done. `style`:
    the prompts' style, which says where a completion's answer is (`is_correct`)."""
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
    first_line = style == "few-shot"
    pairs = zip(texts, answers, strict=True)
    return float(np.mean([is_correct(t, a, first_line) for t, a in pairs]))


def two_proportion_p(before: float, after: float, n_before: int, n_after: int) -> float:
    """Two-sided p-value of the two-proportion z-test (pooled) for accuracies on n problems."""
    pooled = (before * n_before + after * n_after) / (n_before + n_after)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_before + 1 / n_after))
    if se == 0:
        return 1.0 if after == before else 0.0
    return math.erfc(abs(after - before) / se / math.sqrt(2))
