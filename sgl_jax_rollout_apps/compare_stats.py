"""The statistics of `sgl-jax-rollout compare`: pure numpy, tested on synthetic inputs.

Owns greedy agreement (share of identical completions, first diverging position), logprob
fidelity (mean and max |rollout - trainer| over real tokens), per-position total-variation
distance between two sample sets' token frequencies, and the median throughput.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First position where two completions differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if int(x) != int(y):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict:
    """Share of prompts with identical completions, and per prompt the first diverging
    position (None where identical)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same, non-zero number of completions, got {len(a)}, {len(b)}")
    positions = [first_divergence(x, y) for x, y in zip(a, b, strict=True)]
    return {
        "agreement": sum(p is None for p in positions) / len(positions),
        "first_divergence": positions,
    }


def logprob_fidelity(
    rollout: Sequence[Sequence[float]], trainer: Sequence[Sequence[float]]
) -> dict[str, float]:
    """Mean and max |rollout - trainer| over every token (row i: the first len(rollout[i]))."""
    diffs = [
        np.abs(np.asarray(r, np.float64) - np.asarray(t, np.float64)[: len(r)])
        for r, t in zip(rollout, trainer, strict=True)
    ]
    flat = np.concatenate(diffs) if diffs else np.zeros(0)
    if flat.size == 0:
        raise ValueError("no tokens to compare")
    return {
        "mean_abs_diff": float(flat.mean()),
        "max_abs_diff": float(flat.max()),
        "tokens": int(flat.size),
    }


def total_variation(a: Sequence[int], b: Sequence[int]) -> float:
    """TV distance between the empirical distributions of two samples of token ids."""
    if not len(a) or not len(b):
        raise ValueError("both samples need at least one token")
    ca, cb = Counter(int(x) for x in a), Counter(int(x) for x in b)
    na, nb = len(a), len(b)
    return 0.5 * sum(abs(ca[t] / na - cb[t] / nb) for t in set(ca) | set(cb))


def position_tv(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], positions: int) -> dict:
    """Per position t < `positions`: TV between the tokens the two sample sets hold at t
    (samples shorter than t + 1 are left out), with each side's sample size."""
    rows = []
    for t in range(positions):
        xa = [s[t] for s in a if len(s) > t]
        xb = [s[t] for s in b if len(s) > t]
        if not xa or not xb:
            break
        rows.append({"position": t, "tv": total_variation(xa, xb), "n_a": len(xa), "n_b": len(xb)})
    if not rows:
        raise ValueError("no position holds tokens in both sample sets")
    return {"per_position": rows, "mean_tv": float(np.mean([r["tv"] for r in rows]))}


def median_throughput(tokens: Sequence[int], seconds: Sequence[float]) -> float:
    """Median tokens per second over >= 3 timed runs."""
    if len(tokens) != len(seconds) or len(tokens) < 3:
        raise ValueError(f"need >= 3 runs with one token count each, got {len(tokens)}")
    return float(np.median([n / s for n, s in zip(tokens, seconds, strict=True)]))
