"""`sgl-jax-rollout bench soak`: many mixed rollout requests, every completion checked.

Owns the soak: `run` (starts one `SglangJaxRollout`, default the built-in tiny model) and
`run_on` (the same on a rollout you already have, as the engine test does: one engine per
process). The requests (prompts) are spread over generate calls of the kinds in `CALLS`,
which mix n = 1 / 2 / 4, temperatures 0 / 0.7 / 1, top-p / top-k / min-p, penalties and
min_new_tokens, stop strings, `eos_tokens` (common tokens of the previous call, so they do
end completions), `ignore_eos`, several `max_tokens_to_generate`, and prompts of 1..250
tokens (with BOS). Every call is followed by `update_params` with the engine's own weights.
Each completion is checked (`soak_checks`: lengths, values, rescore against `RESCORE_ATOL`, stop
ids and stop strings inside, early end, min_new_tokens, and the engine's per-request stores).
Resident memory (`settled_rss_bytes`) is read after one warm-up pass over every call kind and
after each of the `cycles` calls that follow. A cycle that compiles (the sampler compiles once
per static mode, batch padding and penalty-buffer bucket, so the first row of a kind at a new
size compiles even late in the soak) grows memory by one executable, 5-25 MB here, which is
bounded and no leak: `rss_growth_pct` counts everything, `rss_growth_outside_compiles_pct`
only the cycles without a compile, and that one over `MAX_RSS_GROWTH_PCT` fails the soak as a
bad count does.

Must not fix or work around what it finds (it reports), import the trainer side
(`tunix_adapter`), or read the rollout's private state. `run_on` assumes the rollout samples
with the library's default `SamplingOptions` (not `use_generation_config`), which is what
tells a re-scorable request.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.utils.compiles import count_compiles
from sgl_jax_rollout_apps.bench.resident_memory import rss_bytes, settled_rss_bytes
from sgl_jax_rollout_apps.bench.soak_checks import (
    BAD_KINDS,
    MAX_FAILURES_LISTED,
    RESCORE_ATOL,
    Tally,
    check_call,
)
from sgl_jax_rollout_apps.bench.workloads import WORDS

__all__ = [
    "BAD_KINDS",
    "CALLS",
    "MAX_FAILURES_LISTED",
    "MAX_PROMPT_LENGTH",
    "MAX_PROMPT_TOKENS",
    "MAX_RSS_GROWTH_PCT",
    "RESCORE_ATOL",
    "SETTINGS",
    "SOAK_WORDS",
    "CallKind",
    "check_sizes",
    "rss_bytes",
    "run",
    "run_on",
    "settled_rss_bytes",
]

# The tests' CPU settings (tests/conftest.py) with a KV pool of 4096 tokens, which 16 rows of
# 256 + 40 tokens overflow, so the scheduler queues rows too. The rollout benchmark's batch
# padding 64 and prefill padding 4096 make a call 5-7x slower on this 2-core CPU.
SETTINGS = dict(
    context_length=512,
    max_running_requests=16,
    precompile_bs_paddings=(1, 4, 16),
    precompile_token_paddings=(256, 1024),
    max_prefill_tokens=1024,
    max_total_tokens=4096,
    page_size=1,
    disable_radix_cache=False,
)
MAX_PROMPT_TOKENS = 250  # with BOS
MAX_PROMPT_LENGTH = 256  # RolloutConfig.max_prompt_length: no prompt is cut
MAX_RSS_GROWTH_PCT = 5.0
SOAK_WORDS = [*WORDS, "naïve", "café", "✓", "über", "hello,", "world!", "e", "zz", "."]


@dataclasses.dataclass(frozen=True)
class CallKind:
    """One kind of generate call: RolloutConfig fields, per-call overrides, and whether its
    `eos_tokens` are two common tokens of the previous call."""

    name: str
    max_new: int
    temperature: float
    top_p: float = 1.0
    top_k: int | None = None
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    eos_from_previous: bool = False


CALLS = (
    CallKind("t1_plain", 16, 1.0),
    CallKind("t1_n4_stop_strings", 24, 1.0, overrides=dict(n=4, stop=["e", "zz"])),
    CallKind("t1_n2_eos_tokens", 32, 1.0, overrides=dict(n=2), eos_from_previous=True),
    CallKind(
        "t07_top_p_repetition_stop_strings",
        20,
        0.7,
        top_p=0.9,
        overrides=dict(n=2, repetition_penalty=1.2, stop=[" the", "!"]),
    ),
    CallKind("greedy_eos_tokens", 40, 0.0, eos_from_previous=True),
    CallKind(
        "t1_penalties_min_new_tokens",
        24,
        1.0,
        overrides=dict(n=2, frequency_penalty=0.5, presence_penalty=0.3, min_new_tokens=6),
        eos_from_previous=True,
    ),
    CallKind("t07_top_k_min_p_n4", 12, 0.7, top_k=20, overrides=dict(n=4, min_p=0.05)),
    CallKind("t1_ignore_eos", 8, 1.0, overrides=dict(ignore_eos=True)),
)


def run(
    requests: int = 1000,
    cycles: int = 50,
    seed: int = 0,
    model_path: str | Path | None = None,
) -> dict:
    """Starts one rollout (engine `SETTINGS`), soaks it (`run_on`), shuts it down."""
    check_sizes(requests, cycles)
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.tiny_model import default_model_dir

    model_path = Path(model_path) if model_path else default_model_dir()
    started = time.perf_counter()
    rollout = SglangJaxRollout(model_path=model_path, engine_settings=SETTINGS)
    engine_start_s = time.perf_counter() - started
    try:
        result = run_on(rollout, requests=requests, cycles=cycles, seed=seed)
    finally:
        rollout.shutdown()
    return {"model": str(model_path), "engine_start_s": round(engine_start_s, 1), **result}


def check_sizes(requests: int, cycles: int) -> None:
    if not isinstance(cycles, int) or cycles < 1:
        raise ValueError(f"cycles must be an integer >= 1, got {cycles!r}")
    calls = len(CALLS) + cycles
    if not isinstance(requests, int) or requests < calls:
        raise ValueError(
            f"requests must be an integer >= {calls} (one prompt per generate call: "
            f"{len(CALLS)} warm-up calls + {cycles} cycles), got {requests!r}"
        )


def run_on(rollout, requests: int = 1000, cycles: int = 50, seed: int = 0) -> dict:
    """Soaks `rollout` (an `SglangJaxRollout`; left running) and returns the counts.

    `len(CALLS)` warm-up calls (one of each kind), then `cycles` calls cycling through the
    kinds, each call followed by `update_params(engine_state())`; the `requests` prompts are
    spread evenly over all of them.
    """
    check_sizes(requests, cycles)
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    tokenizer = rollout.engine.tokenizer
    targets = rng.permutation(np.linspace(1, MAX_PROMPT_TOKENS, requests).round().astype(int))
    texts = [_prompt_text(tokenizer, int(t), rng) for t in targets]
    total_calls = len(CALLS) + cycles
    batches = [[texts[i] for i in b] for b in np.array_split(np.arange(requests), total_calls)]
    model_stops = set(inputs.eos_ids(rollout.engine.model_path, rollout.eos_id()))
    model_stops |= {rollout.eos_id(), rollout.pad_id()}
    state = rollout.engine.engine_state()
    tally = Tally()
    previous: list[np.ndarray] = []
    growth_outside_compiles = 0
    cycles_with_compiles = compiles_during_cycles = 0
    for call_index in range(total_calls):
        if call_index == len(CALLS):
            rss_start = rss_before = settled_rss_bytes()
        kind = CALLS[call_index % len(CALLS)]
        eos_tokens = _common_tokens(previous, model_stops) if kind.eos_from_previous else []
        config = _rollout_config(kind, eos_tokens, seed=int(rng.integers(0, 2**31)))
        with count_compiles() as compiles:
            out = rollout.generate(batches[call_index], config, **kind.overrides)
            check_call(rollout, tally, call_index, kind, config, out, model_stops | set(eos_tokens))
            rollout.update_params(state)
        previous = out.tokens
        sizes = rollout.engine.store_sizes()
        if any(sizes.values()):
            tally.bad("stores", call_index, None, f"store sizes after the call: {sizes}")
        if call_index >= len(CALLS):
            rss_after = settled_rss_bytes()
            if compiles.count:
                cycles_with_compiles += 1
                compiles_during_cycles += compiles.count
            else:
                growth_outside_compiles += rss_after - rss_before
            rss_before = rss_after
    rss_end = rss_before
    stores = rollout.engine.store_sizes()
    if any(stores.values()):
        tally.bad("stores", None, None, f"store sizes at the end: {stores}")
    growth = 100.0 * (rss_end / rss_start - 1.0)
    growth_outside = 100.0 * growth_outside_compiles / rss_start
    bad = sum(tally.bad_by_kind.values())
    return {
        "requests": requests,
        "completions": tally.completions,
        "calls": total_calls,
        "cycles": cycles,
        "seed": seed,
        "prompt_tokens": [min(tally.prompt_lengths), max(tally.prompt_lengths)],
        "checked_rescored": tally.rescored,
        "ended_by": dict(tally.ended_by),
        "bad": bad,
        "bad_by_kind": dict(tally.bad_by_kind),
        "failures": tally.failures,
        "max_abs_logprob_diff": tally.max_diff,
        "rss_start_mb": round(rss_start / 2**20, 1),
        "rss_end_mb": round(rss_end / 2**20, 1),
        "rss_growth_pct": round(growth, 2),
        "rss_growth_outside_compiles_pct": round(growth_outside, 2),
        "cycles_with_compiles": cycles_with_compiles,
        "compiles_during_cycles": compiles_during_cycles,
        "stores": stores,
        "ok": bad == 0 and growth_outside <= MAX_RSS_GROWTH_PCT,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _rollout_config(kind: CallKind, eos_tokens: list[int], seed: int):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    return RolloutConfig(
        max_tokens_to_generate=kind.max_new,
        max_prompt_length=MAX_PROMPT_LENGTH,
        temperature=kind.temperature,
        top_p=kind.top_p,
        top_k=kind.top_k,
        seed=seed,
        eos_tokens=eos_tokens or None,
        return_logprobs=True,
    )


def _prompt_text(tokenizer, target: int, rng: np.random.Generator) -> str:
    """Random words whose token count plus BOS is at most `target` (and close to it); "" for
    a BOS-only prompt."""
    words = list(rng.choice(SOAK_WORDS, size=target))

    def count(k: int) -> int:
        return len(tokenizer.encode(" ".join(words[:k]), add_special_tokens=False))

    low, high = 0, len(words)  # largest k with count(k) <= target - 1
    while low < high:
        mid = (low + high + 1) // 2
        if count(mid) <= target - 1:
            low = mid
        else:
            high = mid - 1
    return " ".join(words[:low])


def _common_tokens(completions: list[np.ndarray], exclude: set[int]) -> list[int]:
    """The third and fourth most common tokens of the previous call: frequent enough to end
    some completions, not so frequent that every completion is one token long."""
    counts = collections.Counter(
        t for c in completions for t in np.asarray(c).tolist() if t not in exclude
    )
    return [int(t) for t, _ in counts.most_common(4)[2:]]
