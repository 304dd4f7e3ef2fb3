"""The prompt sets of the rollout benchmark, shared by every backend measured.

Owns `prompts(tokenizer, count, lengths, seed)`: deterministic strings whose token counts
(with the tokenizer's BOS, as the rollouts tokenise them) spread over `lengths`.
"""

from __future__ import annotations

import numpy as np

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "hex",
    "every",
    "jovial",
    "frog",
    "near",
    "the",
    "old",
    "river",
    "bank",
    "and",
    "count",
    "numbers",
    "one",
    "two",
    "three",
]

WORKLOADS = {
    # name: (prompt count, (min, max) prompt tokens, new tokens)
    "16x64_varied": (16, (5, 40), 64),
    "64x64": (64, (16, 16), 64),
}


def prompts(tokenizer, count: int, lengths: tuple[int, int], seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    targets = np.linspace(lengths[0], lengths[1], count).round().astype(int)
    out = []
    for target in targets:
        words = list(rng.choice(WORDS, size=int(target) * 2))
        text = " ".join(words)
        while len(words) > 1 and len(tokenizer.encode(text)) + 1 > target:
            words.pop()
            text = " ".join(words)
        out.append(text)
    return out
