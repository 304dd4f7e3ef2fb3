"""`sgl-jax-rollout bench sampler`: milliseconds per sampling step at vocab 151,936 (Qwen's;
`--vocab 262144` for Gemma's).

Owns the sampler benchmark: for batch sizes 1, 16 and 64 and float32 logits, the median of
>= 20 timed steps after warm-up of
- `argmax`: one pass, the floor;
- `baseline`: temperature + top-k / top-p sampling only (our sampler, outputs off);
- `full`: repetition + frequency + presence penalties, processed logprob, full raw entropy,
  temperature + top-k / top-p sampling;
- `topk_entropy`: as `full` with entropy_top_k = 50;
- `flat_top_p_search` (extra): `full` settings but top-k off, on nearly flat logits, so the
  kept set exceeds the candidates and the exact threshold search runs;
- `sgl_jax`: sgl-jax's own `Sampler` with logprobs on the same logits, when importable.
Ratios are taken at batch 64 within the same run. The `sharded` section (tensor parallelism:
collective bytes and per-device work from compiled programs, `sharded_sampler.py`) comes from
a subprocess with 8 simulated CPU devices.

Must not be imported by the library: it is a CLI subcommand.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from sgl_jax_rollout.sampling import SamplerConfig, SamplingOptions, make_batch, sample

DEFAULT_VOCAB = 151_936  # Qwen2.5 / Qwen3
VOCAB_RANGE = (1_024, 1_048_576)  # and a multiple of 8, for the sharded section
BATCH_SIZES = (1, 16, 64)
PROMPT_LEN, OUTPUT_LEN = 128, 64
TOP_K, TOP_P, TEMPERATURE = 50, 0.9, 0.7
LOGITS_DESCRIPTION = (
    "f32; background normal(0, 1.5) plus 32 head tokens raised by U(4, 10), like an LM's "
    "next-token logits"
)


def check_vocab(vocab: int) -> int:
    """`vocab`, or ValueError naming `--vocab` and what it may be."""
    low, high = VOCAB_RANGE
    if not low <= vocab <= high or vocab % 8:
        raise ValueError(f"--vocab must be a multiple of 8 in [{low:,}, {high:,}], got {vocab:,}")
    return vocab


def lm_like_logits(
    rows: int, seed: int, flat: bool = False, vocab: int = DEFAULT_VOCAB
) -> jax.Array:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 0.05 if flat else 1.5, size=(rows, vocab)).astype(np.float32)
    if not flat:
        for r in range(rows):
            head = rng.choice(vocab, 32, replace=False)
            logits[r, head] += rng.uniform(4.0, 10.0, 32).astype(np.float32)
    return jnp.asarray(logits)


def _options(penalties: bool, top_k: int = TOP_K) -> SamplingOptions:
    extra = (
        {"repetition_penalty": 1.1, "frequency_penalty": 0.2, "presence_penalty": 0.2}
        if penalties
        else {}
    )
    return SamplingOptions(temperature=TEMPERATURE, top_k=top_k, top_p=TOP_P, **extra)


def _batches(rows: int, options: SamplingOptions, steps: int, seed: int, vocab: int):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (rows, PROMPT_LEN)).tolist()
    outputs = rng.integers(0, vocab, (rows, OUTPUT_LEN)).tolist()
    return [
        make_batch(
            [options] * rows,
            vocab_size=vocab,
            keys=rng.integers(0, 2**32, (rows, 2), dtype=np.uint32),
            prompt_ids=prompts,
            output_ids=outputs,
        )
        for _ in range(steps)
    ]


def _median_ms(step: Callable[[int], object], warmup: int, steps: int) -> float:
    for i in range(warmup):
        jax.block_until_ready(step(i))
    times = []
    for i in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(step(i))
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 3)


@jax.jit
def _argmax(logits: jax.Array) -> jax.Array:
    return jnp.argmax(logits, axis=-1)


def _ours(logits, options: SamplingOptions, config: SamplerConfig, steps: int):
    batches = _batches(logits.shape[0], options, steps, seed=1, vocab=logits.shape[1])
    return lambda i: sample(logits, batches[i % steps], config).tokens


def run(steps: int = 20, warmup: int = 3, vocab: int = DEFAULT_VOCAB) -> dict:
    check_vocab(vocab)
    variants = {
        "baseline": (
            _options(penalties=False),
            SamplerConfig(penalties=False, return_logprob=False, return_entropy=False),
        ),
        "full": (_options(penalties=True), SamplerConfig()),
        "topk_entropy": (_options(penalties=True), SamplerConfig(entropy_top_k=50)),
    }
    sgl_step = _sgl_jax_step_factory()
    results: dict[str, dict[str, float]] = {}
    names = ["argmax", *variants, "flat_top_p_search", *(["sgl_jax"] if sgl_step else [])]
    progress = tqdm(total=len(BATCH_SIZES) * len(names), desc="bench sampler", file=sys.stderr)
    for rows in BATCH_SIZES:
        logits = lm_like_logits(rows, seed=rows, vocab=vocab)
        row: dict[str, float] = {}
        row["argmax"] = _median_ms(lambda i, x=logits: _argmax(x), warmup, steps)
        progress.update()
        for name, (options, config) in variants.items():
            row[name] = _median_ms(_ours(logits, options, config, steps), warmup, steps)
            progress.update()
        flat = lm_like_logits(rows, seed=rows, flat=True, vocab=vocab)
        row["flat_top_p_search"] = _median_ms(
            _ours(flat, _options(penalties=True, top_k=-1), SamplerConfig(), steps),
            1,
            max(3, steps // 4),
        )
        progress.update()
        if sgl_step:
            row["sgl_jax"] = _median_ms(sgl_step(logits), warmup, steps)
            progress.update()
        results[str(rows)] = row
    progress.close()

    at64 = results["64"]
    ratios = {
        "full_vs_baseline": round(at64["full"] / at64["baseline"], 3),
        "topk_entropy_vs_baseline": round(at64["topk_entropy"] / at64["baseline"], 3),
        "full_vs_argmax": round(at64["full"] / at64["argmax"], 3),
        "topk_entropy_vs_argmax": round(at64["topk_entropy"] / at64["argmax"], 3),
    }
    if "sgl_jax" in at64:
        ratios["full_vs_sgl_jax"] = round(at64["full"] / at64["sgl_jax"], 3)
    sharded = _sharded(vocab)
    return {
        "bench": "sampler",
        "vocab": vocab,
        "unit": "ms per step (median)",
        "steps": steps,
        "device": str(jax.devices()[0].platform),
        "settings": {
            "temperature": TEMPERATURE,
            "top_k": TOP_K,
            "top_p": TOP_P,
            "penalties (full)": "repetition 1.1, frequency 0.2, presence 0.2",
            "history": f"{PROMPT_LEN} prompt + {OUTPUT_LEN} output ids per row",
            "logits": LOGITS_DESCRIPTION,
        },
        "rows": results,
        "ratios": ratios,
        "sharded": sharded,
    }


def _sharded(vocab: int) -> dict:
    """`sharded_sampler.py`'s measurement, from a process with 8 simulated CPU devices."""
    print("bench sampler: sharded section (8 simulated devices, compiles only)", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "sgl_jax_rollout_apps.bench.sharded_sampler", str(vocab)],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the sharded sampler measurement failed: {done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _sgl_jax_step_factory():
    """sgl-jax's own sampler with logprobs, or None when sgl_jax cannot be imported."""
    try:
        from sgl_jax_rollout_apps.bench.sgl_jax_sampler import make_sgl_jax_step
    except ImportError:
        return None
    return make_sgl_jax_step(TEMPERATURE, TOP_K, TOP_P)
