"""Reward functions in tunix's shape: `fn(prompts, completions, **dataset_fields) -> list[float]`.

Owns the strict binary function-calling reward of the seed setting (`function_call_reward`:
1.0 only when the completion is well formed AND calls the expected function with the
expected arguments) and the toy reward of the CPU demo (`vowel_word_reward`).

Function-call format: exactly one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
block (the Qwen / Hermes convention), optionally preceded by a closed `<think>...</think>`
span, and nothing else but whitespace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_CALL = re.compile(
    r"^\s*(?:<think>.*?</think>\s*)?<tool_call>(?P<body>.*?)</tool_call>\s*$", re.DOTALL
)


def parse_function_call(completion: str) -> dict[str, Any] | None:
    """The call as {"name", "arguments"} when `completion` is well formed, else None."""
    match = _CALL.match(completion)
    if match is None or "<tool_call>" in match.group("body"):
        return None
    try:
        call = json.loads(match.group("body"))
    except json.JSONDecodeError:
        return None
    if (
        not isinstance(call, dict)
        or set(call) != {"name", "arguments"}
        or not isinstance(call["name"], str)
        or not isinstance(call["arguments"], dict)
    ):
        return None
    return call


def function_call_reward(
    prompts: Sequence[Any],
    completions: Sequence[str],
    expected_call: Sequence[Mapping[str, Any] | str],
    **_: Any,
) -> list[float]:
    """1.0 iff the completion is a well-formed call equal to `expected_call` (JSON-equal)."""
    if len(expected_call) != len(completions):
        raise ValueError(
            f"expected_call must have one entry per completion ({len(completions)}), got "
            f"{len(expected_call)}"
        )
    rewards = []
    for completion, expected in zip(completions, expected_call, strict=True):
        if isinstance(expected, str):
            expected = json.loads(expected)
        call = parse_function_call(completion)
        correct = call is not None and call == {
            "name": expected["name"],
            "arguments": dict(expected["arguments"]),
        }
        rewards.append(1.0 if correct else 0.0)
    return rewards


def vowel_word_reward(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float]:
    """Toy reward of the CPU demo: the share of a completion's words that start with a vowel.

    Dense (every sample gets a different value, so GRPO groups have variance from step 0) and
    reachable by a tiny random model by shifting mass between vocabulary entries.
    """
    out = []
    for text in completions:
        words = re.findall(r"[^\W\d_]+", text)
        out.append(sum(w[0].lower() in "aeiou" for w in words) / len(words) if words else 0.0)
    return out
