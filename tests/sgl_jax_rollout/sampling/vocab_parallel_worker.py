"""Runs the vocabulary-parallel sampler against the unsharded one on 8 simulated CPU devices
and prints, per case, what differs, as one JSON line (`RESULT {...}`).

Started by tests/sgl_jax_rollout/sampling/test_vocab_parallel.py in a subprocess (XLA_FLAGS
must be set before jax starts): `python -m tests.sgl_jax_rollout.sampling.vocab_parallel_worker`.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import dataclasses  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sgl_jax_rollout.sampling import SamplerConfig, SamplingOptions, make_batch, sample  # noqa: E402
from sgl_jax_rollout.sampling.penalties import occurrence_tables  # noqa: E402
from sgl_jax_rollout.sampling.vocab_parallel import sample_vocab_parallel  # noqa: E402
from tests.sgl_jax_rollout.sampling.test_sampler import EOS, OUTPUTS, PROMPTS, ROWS  # noqa: E402

VOCAB = 320  # 12 rows, every row setting of test_sampler.py
LARGE_VOCAB = 8 * 128 * 70  # a shard of 8 has 70 top-k blocks: the blocked top-k path
# (data, tensor) meshes over the 8 devices.
MESHES = [(1, 2), (1, 4), (1, 8), (2, 4)]
MODES = list(itertools.product(("processed", "raw"), ("raw", "processed"), (0, 7)))


def logits_for(rows: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, vocab)) * 2.5
    logits[min(8, rows - 1)] *= 0.05  # nearly flat: top-p needs most of the vocabulary
    logits[3, 100:200] = -np.inf  # partly masked row
    logits[4, 17] += 40.0  # fully peaked row
    return logits.astype(np.float32)


def cases():
    """(name, logits, batch, config) of every case."""
    batch = make_batch(
        ROWS, vocab_size=VOCAB, prompt_ids=PROMPTS, output_ids=OUTPUTS, eos_token_ids=[EOS]
    )
    logits = logits_for(len(ROWS), VOCAB, seed=0)
    for logprobs_mode, entropy_source, entropy_top_k in MODES:
        config = SamplerConfig(
            logprobs_mode=logprobs_mode,
            entropy_source=entropy_source,
            entropy_top_k=entropy_top_k,
            top_logprobs=3,
            candidates=16,  # rows with top_k = 120 or flat top-p take the exact search
        )
        yield (
            f"{logprobs_mode}-logprob/{entropy_source}-entropy/top{entropy_top_k}",
            (
                logits,
                batch,
                config,
            ),
        )
    seen, counts = occurrence_tables(batch.prompt_ids, batch.output_ids, VOCAB)
    dense = dataclasses.replace(batch, seen=seen, output_counts=counts)
    yield "dense-penalty-tables", (logits, dense, SamplerConfig(candidates=16))
    yield "padded-vocab", (logits, batch, SamplerConfig(valid_vocab_size=300, candidates=16))
    plain = [
        dataclasses.replace(o, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
        for o in ROWS
    ]
    yield (
        "no-penalties",
        (
            logits,
            make_batch(plain, vocab_size=VOCAB, eos_token_ids=[EOS]),
            SamplerConfig(penalties=False, entropy_top_k=7, logprobs_mode="raw", top_logprobs=3),
        ),
    )
    large_rows = [
        SamplingOptions(seed=i, temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.1)
        for i in range(8)
    ]
    yield (
        "large-vocab",
        (
            logits_for(8, LARGE_VOCAB, seed=1),
            make_batch(large_rows, vocab_size=LARGE_VOCAB, prompt_ids=[[5, 6]] * 8),
            SamplerConfig(),
        ),
    )


def differences(want, got) -> dict:
    report = {"tokens_equal": bool(np.array_equal(want.tokens, got.tokens))}
    for field in ("logprobs", "entropy", "top_logprobs"):
        a, b = getattr(want, field), getattr(got, field)
        if a is None:
            continue
        a, b = np.asarray(a), np.asarray(b)
        assert np.array_equal(np.isfinite(a), np.isfinite(b)), field
        finite = np.isfinite(a)
        report[field] = float(np.abs(a[finite] - b[finite]).max()) if finite.any() else 0.0
    if want.top_logprob_ids is not None:
        report["top_ids_equal"] = bool(np.array_equal(want.top_logprob_ids, got.top_logprob_ids))
    return report


def main() -> None:
    devices = np.asarray(jax.devices())
    result = {"devices": len(devices), "cases": {}}
    for name, (logits, batch, config) in cases():
        want = sample(jnp.asarray(logits), batch, config)
        for data, tensor in MESHES:
            if logits.shape[0] % data:
                continue
            mesh = jax.sharding.Mesh(
                devices[: data * tensor].reshape(data, tensor),
                ("data", "tensor"),
                axis_types=(jax.sharding.AxisType.Explicit,) * 2,
            )
            got = sample_vocab_parallel(
                jnp.asarray(logits),
                batch,
                config,
                mesh=mesh,
                batch_axis="data" if data > 1 else None,
            )
            result["cases"][f"{name} dp{data}xtp{tensor}"] = differences(want, got)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
