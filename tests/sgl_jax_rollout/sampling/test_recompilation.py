"""Changing per-row settings never recompiles; a new static mode compiles once."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from sgl_jax_rollout.sampling import SamplerConfig, SamplingOptions, make_batch, sample
from sgl_jax_rollout.utils.compiles import count_compiles

VOCAB = 200
ROWS = 4


def _batch(rng: np.random.Generator):
    rows = [
        SamplingOptions(
            seed=int(rng.integers(1 << 30)),
            temperature=float(rng.choice([0.0, 0.5, 1.0, 1.7])),
            top_k=int(rng.choice([-1, 1, 5, 150])),
            top_p=float(rng.choice([1.0, 0.9, 0.3])),
            min_p=float(rng.choice([0.0, 0.05, 0.5])),
            repetition_penalty=float(rng.choice([1.0, 1.2, 0.9])),
            frequency_penalty=float(rng.choice([0.0, 0.5, -1.0])),
            presence_penalty=float(rng.choice([0.0, 1.0])),
            min_new_tokens=int(rng.choice([0, 3])),
        )
        for _ in range(ROWS)
    ]
    prompts = [list(rng.integers(0, VOCAB, 6)) for _ in range(ROWS)]
    outputs = [list(rng.integers(0, VOCAB, 4)) for _ in range(ROWS)]
    return make_batch(
        rows, vocab_size=VOCAB, prompt_ids=prompts, output_ids=outputs, eos_token_ids=[3]
    )


def test_changing_per_row_settings_never_recompiles():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(ROWS, VOCAB)).astype(np.float32))
    config = SamplerConfig(candidates=16, top_logprobs=2)
    sample(logits, _batch(rng), config).tokens.block_until_ready()
    with count_compiles() as compiles:
        for _ in range(12):
            sample(logits, _batch(rng), config).tokens.block_until_ready()
    assert compiles.count == 0


def test_new_static_mode_compiles_once():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(ROWS, VOCAB)).astype(np.float32))
    config = SamplerConfig(logprobs_mode="raw", entropy_source="processed", entropy_top_k=9)
    with count_compiles() as compiles:
        for _ in range(3):
            sample(logits, _batch(rng), config).tokens.block_until_ready()
    assert compiles.count >= 1
    first = compiles.count
    with count_compiles() as again:
        sample(logits, _batch(rng), config).tokens.block_until_ready()
    assert again.count == 0 and first >= 1
