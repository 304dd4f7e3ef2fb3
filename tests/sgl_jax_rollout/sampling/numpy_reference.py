"""An independent float64 numpy reference of docs/design.md section 3, one row at a time.

Written from the spec, sorting the vocabulary the plain way: nothing here is shared with the
sampler under test.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sgl_jax_rollout.sampling import SamplingOptions


@dataclasses.dataclass
class RowReference:
    raw_logprobs: np.ndarray  # log_softmax of the raw logits
    processed_logprobs: np.ndarray  # log of the step-5 distribution (-inf outside the kept set)
    penalised: np.ndarray  # logits after step 2


def hf_repetition_penalty(scores: np.ndarray, input_ids: list[int], penalty: float) -> np.ndarray:
    """Hugging Face's RepetitionPenaltyLogitsProcessor formula on one row."""
    scores = scores.copy()
    ids = np.asarray(sorted(set(input_ids)), dtype=np.int64)
    if ids.size:
        score = scores[ids]
        scores[ids] = np.where(score < 0, score * penalty, score / penalty)
    return scores


def log_softmax(x: np.ndarray) -> np.ndarray:
    finite = x[np.isfinite(x)]
    m = finite.max() if finite.size else 0.0
    with np.errstate(divide="ignore"):
        return x - m - np.log(np.exp(x - m).sum())


def entropy(logprobs: np.ndarray) -> float:
    p = np.exp(logprobs)
    return float(-np.sum(np.where(p > 0, p * np.where(p > 0, logprobs, 0.0), 0.0)))


def top_k_entropy(logits: np.ndarray, k: int) -> float:
    """Entropy of the k largest logits renormalised over those k."""
    top = np.sort(logits)[::-1][:k]
    return entropy(log_softmax(top))


def reference_row(
    logits: np.ndarray,
    options: SamplingOptions,
    prompt_ids: list[int] = (),
    output_ids: list[int] = (),
    eos_ids: list[int] = (),
    valid_vocab_size: int | None = None,
) -> RowReference:
    z = np.asarray(logits, dtype=np.float64).copy()
    if valid_vocab_size is not None:
        z[valid_vocab_size:] = -np.inf
    raw = z.copy()

    z = hf_repetition_penalty(z, list(prompt_ids) + list(output_ids), options.repetition_penalty)
    counts = np.bincount(np.asarray(output_ids, dtype=np.int64), minlength=z.size)[: z.size]
    z = z - options.frequency_penalty * counts - options.presence_penalty * (counts > 0)
    if len(output_ids) < options.min_new_tokens:
        stops = list(options.stop_token_ids) + ([] if options.ignore_eos else list(eos_ids))
        z[np.asarray(stops, dtype=np.int64)] = -np.inf
    penalised = z.copy()

    if options.temperature == 0:
        return RowReference(log_softmax(raw), log_softmax(penalised), penalised)

    t = z / options.temperature
    keep = np.isfinite(t)
    vocab = t.size
    if 0 < options.top_k < vocab:
        kth = np.sort(t)[::-1][options.top_k - 1]
        keep &= t >= kth
    if options.top_p < 1:
        lp = log_softmax(np.where(keep, t, -np.inf))
        order = np.argsort(-t, kind="stable")
        cum = np.cumsum(np.exp(lp[order]))
        boundary = int(np.argmax(cum >= options.top_p)) if cum[-1] >= options.top_p else vocab - 1
        keep &= t >= t[order[boundary]]
    if options.min_p > 0:
        lp = log_softmax(np.where(keep, t, -np.inf))
        keep &= lp >= np.log(options.min_p) + lp.max()
    processed = log_softmax(np.where(keep, t, -np.inf))
    return RowReference(log_softmax(raw), processed, penalised)
