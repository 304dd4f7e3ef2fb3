"""Calls from many threads at once share the engine (continuous batching across calls), as
tunix's agentic learner makes them: each returns what the same call made alone returns, per-call
options never leak, an error or an early stop in one call touches no other, and a weight sync
racing the calls never mixes two weight versions inside a completion.

On the suite's session engine (`rollout` fixture: 16 request slots, batch buckets 1 / 4 / 16).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgl_jax_rollout.rollout_inputs import right_pad_ids
from sgl_jax_rollout.tunix_compat import RolloutConfig
from tests.conftest import LISTED_SAMPLER_MODE
from tests.conftest import perturbed as perturbed_state
from tunix_adapter.scoring import before_pad

pytestmark = pytest.mark.engine

PROMPTS = [f"question {i}: what is {i} plus {2 * i}?" for i in range(16)]
MAX_PROMPT = 32
ROWS = 16  # the trainer scores this many rows at once (one program)


def config(prompt_seed: int, **changes) -> RolloutConfig:
    base = dict(
        max_tokens_to_generate=16,
        max_prompt_length=MAX_PROMPT,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        seed=[prompt_seed],
        return_logprobs=True,
    )
    return RolloutConfig(**{**base, **changes})


# Per-call options of the 16 calls, each a (RolloutConfig changes, SamplingOptions overrides):
# temperatures, truncations, penalties, stop strings, lengths and two sampler output modes.
CALLS = [
    ({}, {}),
    (dict(temperature=0.7), {}),
    (dict(top_k=5), {}),
    (dict(top_p=0.8), {}),
    ({}, dict(min_p=0.05)),
    ({}, dict(repetition_penalty=1.3)),
    (dict(max_tokens_to_generate=5), {}),
    ({}, dict(stop=["e"])),
    ({}, dict(LISTED_SAMPLER_MODE)),
    (dict(temperature=0.5), dict(LISTED_SAMPLER_MODE)),
    ({}, dict(frequency_penalty=0.5)),
    (dict(temperature=0.0), {}),
    ({}, dict(ignore_eos=True)),
    (dict(top_k=3, temperature=1.3), {}),
    ({}, {}),
    (dict(max_tokens_to_generate=9), dict(presence_penalty=0.4)),
]


def one_call(rollout, i: int):
    changes, overrides = CALLS[i]
    return rollout.generate([PROMPTS[i]], config(100 + i, **changes), **overrides)


def same_output(a, b) -> None:
    assert a.tokens[0].tolist() == b.tokens[0].tolist() and a.text == b.text
    np.testing.assert_allclose(a.logprobs[0], b.logprobs[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(a.entropy[0], b.entropy[0], atol=1e-5, rtol=0)


def trainer_scores(trainer, rollout, outs) -> np.ndarray:
    """The trainer's logprobs (temperature 1) of one-row outputs, `[len(outs), 16]`, scored
    as one batch of `ROWS` rows (repeats of the last fill it: one program)."""
    from sgl_jax_rollout.tunix_compat import per_token_logps_and_logits

    prompts = np.concatenate([np.asarray(o.left_padded_prompt_tokens) for o in outs])
    completions = right_pad_ids([o.tokens[0] for o in outs], 16, rollout.pad_id())
    fill = ROWS - len(outs)
    prompts = np.concatenate([prompts, np.repeat(prompts[-1:], fill, 0)])
    completions = np.concatenate([completions, np.repeat(completions[-1:], fill, 0)])
    graphdef, state = nnx.split(trainer)
    logps = per_token_logps_and_logits(
        graphdef,
        state,
        jnp.asarray(prompts),
        jnp.asarray(completions),
        rollout.pad_id(),
        rollout.eos_id(),
        1.0,
    )[0]
    return np.asarray(logps)[: len(outs)]


def test_sixteen_concurrent_calls_return_what_each_returns_alone(rollout, trainer):
    """16 one-prompt calls, each with its own options, from 16 threads at once; meanwhile a
    17th thread scores. Each output equals the same call made alone (the calls of the listed
    mode wait for the others' mode, then run together); a call with a bad option fails alone;
    the plain temperature-1 calls match the trainer's logprobs."""
    alone = [one_call(rollout, i) for i in range(len(CALLS))]
    prompt_tokens = jnp.asarray(alone[0].left_padded_prompt_tokens)
    completion = right_pad_ids([alone[0].tokens[0]], 16, rollout.pad_id())
    scored_alone = np.asarray(rollout.get_per_token_logps(prompt_tokens, jnp.asarray(completion)))
    start = threading.Barrier(len(CALLS) + 2)

    def call(i):
        start.wait()
        return one_call(rollout, i)

    def bad():
        start.wait()
        return rollout.generate([PROMPTS[0]], config(1), top_p=1.5)

    def score():
        start.wait()
        return rollout.get_per_token_logps(prompt_tokens, jnp.asarray(completion))

    with ThreadPoolExecutor(len(CALLS) + 2) as pool:
        failing = pool.submit(bad)
        scoring = pool.submit(score)
        outs = list(pool.map(call, range(len(CALLS))))
    with pytest.raises(ValueError, match="top_p"):
        failing.result()
    np.testing.assert_allclose(np.asarray(scoring.result()), scored_alone, atol=1e-5, rtol=0)
    for out, expected in zip(outs, alone, strict=True):
        same_output(out, expected)
        assert len(out.versions[0]) == len(out.tokens[0])
    assert len(outs[6].tokens[0]) <= 5 and len(outs[12].tokens[0]) == 16  # limits kept apart
    plain = [0, 14]
    reference = trainer_scores(trainer, rollout, [outs[i] for i in plain])
    for row, i in enumerate(plain):
        k = before_pad(outs[i].tokens[0], rollout.pad_id())
        assert k >= 4
        np.testing.assert_allclose(outs[i].logprobs[0][:k], reference[row, :k], atol=1e-4)


def test_an_early_stopped_call_aborts_only_its_own_requests(rollout):
    """`generate_groups` needing 1 group of 4 aborts its other groups' requests while 8 other
    calls run: theirs finish as when made alone."""
    alone = [one_call(rollout, i) for i in range(8)]
    with ThreadPoolExecutor(9) as pool:
        early = pool.submit(
            rollout.generate_groups,
            PROMPTS[8:12],
            config(0, seed=3),
            1,
            ignore_eos=True,
        )
        outs = list(pool.map(lambda i: one_call(rollout, i), range(8)))
    kept, keys = early.result()
    assert len(keys) == 1 and len(kept.tokens) == 1
    for out, expected in zip(outs, alone, strict=True):
        same_output(out, expected)


def test_a_weight_sync_racing_sixteen_calls_never_mixes_versions(rollout, trainer):
    """16 threads each make two calls; once at least 8 calls run, `update_params` arrives. It
    waits for the calls running, the calls arriving meanwhile wait for it: every completion is
    sampled under one version, which its `versions` names, and its logprobs are the trainer's
    under that version's weights."""
    original = jax.tree_util.tree_map(jnp.copy, nnx.state(trainer, nnx.Param))
    new_state = perturbed_state(original, 0.5, 11)
    before = rollout.policy_version
    gate = rollout.engine._gate
    outs: list = [None] * 32

    def calls(i):
        for turn in range(2):
            outs[2 * i + turn] = rollout.generate(
                [PROMPTS[i]], config(200 + 2 * i + turn), ignore_eos=True
            )

    try:
        with ThreadPoolExecutor(16) as pool:
            running = [pool.submit(calls, i) for i in range(16)]
            deadline = time.monotonic() + 60
            while gate.serving_calls() < 8 and time.monotonic() < deadline:
                time.sleep(0.001)
            rollout.update_params(new_state)
            for future in running:
                future.result()
        assert rollout.policy_version == before + 1
        versions = [int(out.versions[0][0]) for out in outs]
        for out, version in zip(outs, versions, strict=True):
            assert set(out.versions[0].tolist()) == {version}
        assert set(versions) == {before, before + 1}
        for version, weights in ((before, original), (before + 1, new_state)):
            nnx.update(trainer, weights)
            group = [out for out, v in zip(outs, versions, strict=True) if v == version]
            for start in range(0, len(group), ROWS):
                part = group[start : start + ROWS]
                reference = trainer_scores(trainer, rollout, part)
                for row, out in enumerate(part):
                    k = before_pad(out.tokens[0], rollout.pad_id())
                    np.testing.assert_allclose(
                        out.logprobs[0][:k], reference[row, :k], atol=1e-4, rtol=0
                    )
    finally:
        nnx.update(trainer, original)
        rollout.update_params(original)
