"""The jitted sampler: pure JAX, imports neither tunix nor sgl_jax.

`sample(logits, batch, config)` runs one decode step (`sample_vocab_parallel` the same step on
logits split over the vocabulary across a mesh axis); `SamplingOptions` is the user-facing,
validated description of one request's settings; `make_batch` and `config_for` turn rows of
options into the sampler's per-row arrays and static config.
"""

from sgl_jax_rollout.sampling.batch import (
    NO_TOKEN,
    SamplerConfig,
    SamplerOutput,
    SamplingBatch,
    config_for,
    make_batch,
    row_key,
)
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.sampling.sampler import sample
from sgl_jax_rollout.sampling.vocab_parallel import sample_vocab_parallel

__all__ = [
    "NO_TOKEN",
    "SamplerConfig",
    "SamplerOutput",
    "SamplingBatch",
    "SamplingOptions",
    "config_for",
    "make_batch",
    "row_key",
    "sample",
    "sample_vocab_parallel",
]
