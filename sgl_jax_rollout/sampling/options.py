"""User-facing sampling options and their validation.

Owns `SamplingOptions`: one frozen dataclass holding every per-request sampling setting
(penalties, temperature, truncation, stop conditions, seed, which logprob and entropy to
return). Every field is checked at construction and the error names the field and its allowed
range, so bad input fails before anything is compiled or sent to an engine.

Must not import jax, tunix or sgl_jax: options are built and validated on the host.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

LOGPROBS_MODES = ("processed", "raw")
ENTROPY_SOURCES = ("raw", "processed")
# OpenAI's documented range for frequency / presence penalties.
ADDITIVE_PENALTY_RANGE = (-2.0, 2.0)
MAX_TOP_LOGPROBS = 20


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    """Sampling settings of one request (docs/design.md section 3).

    temperature: 0 means greedy for this request; otherwise logits are divided by it.
    top_k: -1 disables top-k; otherwise keep the k most likely tokens.
    top_p: keep the smallest set of tokens whose mass reaches top_p (1.0 disables).
    min_p: keep tokens whose probability is at least min_p times the largest (0 disables).
    repetition_penalty: HF / vLLM convention over prompt and output tokens (1.0 disables).
    frequency_penalty, presence_penalty: OpenAI convention over output tokens (0 disables).
    min_new_tokens: stop tokens are impossible until this many tokens were generated.
    stop, stop_token_ids, ignore_eos: stop conditions (applied by the engine).
    no_stop_trim (SGLang's and sgl-jax's name), include_stop_str_in_output (vLLM's): either
        True keeps a matched stop string in the output text; by default (both False, as in
        both peers) the text ends before it. Tokens, logprobs and entropy always keep every
        sampled token.
    seed: per-request seed; the same seed gives the same tokens whatever else is batched.
    logprobs_mode: "processed" (the behaviour policy's probability) or "raw" (model logits).
    entropy_source: entropy of the "raw" (pre-penalty, pre-temperature) or "processed"
        distribution; entropy_top_k: 0 = full vocabulary, k > 0 = the k largest logits,
        renormalised over those k.
    top_logprobs: also return this many most likely tokens with their logprobs.
    n: number of samples of the prompt.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    no_stop_trim: bool = False
    include_stop_str_in_output: bool = False
    seed: int | None = None
    logprobs_mode: str = "processed"
    entropy_source: str = "raw"
    entropy_top_k: int = 0
    top_logprobs: int = 0
    return_logprobs: bool = True
    return_entropy: bool = True

    def __post_init__(self) -> None:
        # Sequences arrive as lists from users and configs; store tuples so options hash.
        object.__setattr__(self, "stop", _str_tuple("stop", self.stop))
        object.__setattr__(
            self, "stop_token_ids", _int_tuple("stop_token_ids", self.stop_token_ids)
        )
        _check_int("n", self.n, low=1)
        _check_float("temperature", self.temperature, low=0.0)
        if not _is_int(self.top_k) or (self.top_k != -1 and self.top_k < 1):
            raise ValueError(f"top_k must be -1 (disabled) or an integer >= 1, got {self.top_k!r}")
        _check_float("top_p", self.top_p, low=0.0, low_open=True, high=1.0)
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        _check_float("repetition_penalty", self.repetition_penalty, low=0.0, low_open=True)
        _check_float("frequency_penalty", self.frequency_penalty, *ADDITIVE_PENALTY_RANGE)
        _check_float("presence_penalty", self.presence_penalty, *ADDITIVE_PENALTY_RANGE)
        _check_int("min_new_tokens", self.min_new_tokens, low=0)
        _check_bool("ignore_eos", self.ignore_eos)
        _check_bool("no_stop_trim", self.no_stop_trim)
        _check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=2**63 - 1)
        _check_choice("logprobs_mode", self.logprobs_mode, LOGPROBS_MODES)
        _check_choice("entropy_source", self.entropy_source, ENTROPY_SOURCES)
        _check_int("entropy_top_k", self.entropy_top_k, low=0)
        _check_int("top_logprobs", self.top_logprobs, low=0, high=MAX_TOP_LOGPROBS)
        _check_bool("return_logprobs", self.return_logprobs)
        _check_bool("return_entropy", self.return_entropy)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def trimmed_stops(self) -> tuple[str, ...]:
        """The stop strings the output text ends before (none with `no_stop_trim` or
        `include_stop_str_in_output`)."""
        return () if self.no_stop_trim or self.include_stop_str_in_output else self.stop

    def replace(self, **overrides: Any) -> SamplingOptions:
        """A copy with `overrides` applied; unknown names raise `ValueError`."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            allowed = ", ".join(f.name for f in dataclasses.fields(self))
            raise ValueError(f"unknown sampling option(s) {unknown}; allowed: {allowed}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SamplingOptions:
        return cls().replace(**dict(values))

    def validate_for_vocab(self, vocab_size: int) -> SamplingOptions:
        """Checks the fields bounded by the model's vocabulary; returns self."""
        if self.entropy_top_k > vocab_size:
            raise ValueError(
                f"entropy_top_k must be in [0, {vocab_size}] (the vocabulary size), "
                f"got {self.entropy_top_k}"
            )
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(
                f"stop_token_ids must be in [0, {vocab_size}) (the vocabulary size), got {bad}"
            )
        return self


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    upper = "" if high is None else f" and <= {high}"
    if not _is_int(value) or value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer >= {low}{upper}, got {value!r}")


def _check_float(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
) -> None:
    lo_bracket = "(" if low_open else "["
    allowed = f"{lo_bracket}{'-inf' if low is None else low}, {'inf' if high is None else high}]"
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value)
        ok = ok and (low is None or (value > low if low_open else value >= low))
        ok = ok and (high is None or value <= high)
    if not ok:
        raise ValueError(f"{name} must be a finite number in {allowed}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _str_tuple(name: str, value: Any) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    try:
        items = tuple(items)
    except TypeError:
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r}") from None
    if not all(isinstance(s, str) and s for s in items):
        raise ValueError(f"{name} must hold non-empty strings, got {value!r}")
    return items


def _int_tuple(name: str, value: Any) -> tuple[int, ...]:
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a list of token ids, got {value!r}") from None
    if not all(_is_int(t) and t >= 0 for t in items):
        raise ValueError(f"{name} must hold integer token ids >= 0, got {value!r}")
    return items
