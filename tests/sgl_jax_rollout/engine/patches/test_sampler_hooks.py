"""Sampler hooks (`patches/sampler_hooks.py`) around upstream calls, driven with a test
double of the upstream side (a stub `original` that records what upstream would receive): the
code under test is our wrapper; the live engine runs it in every engine test (tokens,
logprobs and entropy there are checked against the trainer)."""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.engine  # needs sgl-jax importable (no engine is started)


@pytest.mark.parametrize("upstream_reads_logprobs", [False, True])
def test_upstream_materialises_logprobs_only_for_a_batch_that_asks(upstream_reads_logprobs):
    from sgl_jax_rollout.engine.patches import sampler_hooks
    from sgl_jax_rollout.engine.sampler_module import RolloutLogitsOutput

    logprobs = jnp.array([-1.0, -2.0, -3.0, -4.0])
    entropy = jnp.array([0.5, 1.5, 2.5, 3.5])
    out = RolloutLogitsOutput(next_token_logits=jnp.zeros((4, 8)))
    out.next_token_logprobs, out.rollout_entropy = logprobs, entropy
    batch = types.SimpleNamespace(
        return_logprob=upstream_reads_logprobs, return_output_logprob_only=False
    )
    seen = {}

    def original(self, logits_output, model_worker_batch, selector):
        seen["logprobs"] = logits_output.next_token_logprobs

    sampler_hooks._outputs_in_flight(original, None, out, batch, np.arange(4))
    # our outputs stay device arrays (their host copies started), read later by `_collect`
    assert out.rollout_entropy is entropy
    if upstream_reads_logprobs:
        assert seen["logprobs"] is logprobs and out.rollout_logprobs is None
    else:
        assert seen["logprobs"] is None and out.rollout_logprobs is logprobs
    assert out.rollout_top_logprobs is None
