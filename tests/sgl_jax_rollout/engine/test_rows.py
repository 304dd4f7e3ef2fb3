"""Per-step rows for the engine's sampler: padding, buckets, modes, keys."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout.engine.rows import (
    RequestSpec,
    build_rows,
    extra_sampler_configs,
    pack_rows,
    sampler_config,
    unpack_rows,
)
from sgl_jax_rollout.sampling.batch import MIN_TOKEN_WIDTH, NO_TOKEN, bucket, row_key, step_keys
from sgl_jax_rollout.sampling.options import SamplingOptions


def spec(**kw) -> RequestSpec:
    kw.setdefault("seed", 1)
    stop = kw.pop("stop_ids", ())
    return RequestSpec(SamplingOptions(**kw), stop_ids=stop)


def test_request_spec_requires_a_seed_and_one_sample():
    with pytest.raises(ValueError, match="seed"):
        RequestSpec(SamplingOptions())
    with pytest.raises(ValueError, match="expand n"):
        RequestSpec(SamplingOptions(seed=1, n=2))


def test_bucket_is_the_next_power_of_two_above_the_minimum():
    assert [bucket(n, 64) for n in (0, 1, 64, 65, 200)] == [64, 64, 64, 128, 256]


def test_rows_without_penalties_are_padded_greedy_and_carry_base_keys():
    specs = [spec(temperature=0.5, top_k=3, seed=5), spec(top_p=0.8, min_p=0.1, seed=9)]
    config = sampler_config(specs, valid_vocab_size=None)
    assert not config.penalties
    rows = build_rows(specs, [[1, 2], [3]], [[], [7, 8, 9]], padded_rows=4, config=config)
    np.testing.assert_array_equal(rows.temperature, [0.5, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(rows.top_k, [3, -1, -1, -1])
    np.testing.assert_allclose(rows.top_p, [1.0, 0.8, 1.0, 1.0])
    np.testing.assert_allclose(rows.min_p, [0.0, 0.1, 0.0, 0.0])
    np.testing.assert_array_equal(rows.num_generated, [0, 3, 0, 0])
    assert rows.prompt_ids is None and rows.output_ids is None
    keys = np.asarray(step_keys(jnp.asarray(rows.keys), jnp.asarray(rows.num_generated)))
    np.testing.assert_array_equal(keys[0], row_key(5, 0))
    np.testing.assert_array_equal(keys[1], row_key(9, 3))


def test_rows_with_penalties_pad_token_ids_to_width_buckets():
    specs = [spec(repetition_penalty=1.2), spec(min_new_tokens=2, stop_ids=(2, 5))]
    config = sampler_config(specs, valid_vocab_size=1000)
    assert config.penalties and config.valid_vocab_size == 1000
    prompt = list(range(70))
    rows = build_rows(specs, [prompt, [4]], [[9], []], padded_rows=4, config=config)
    assert rows.prompt_ids.shape == (4, 128)
    assert rows.output_ids.shape == (4, MIN_TOKEN_WIDTH)
    assert rows.stop_token_ids.shape == (4, 8)
    np.testing.assert_array_equal(rows.prompt_ids[0, :70], prompt)
    assert (rows.prompt_ids[0, 70:] == NO_TOKEN).all() and (rows.prompt_ids[2:] == NO_TOKEN).all()
    np.testing.assert_array_equal(rows.stop_token_ids[1, :2], [2, 5])
    assert rows.min_new_tokens.tolist() == [0, 2, 0, 0]


def test_none_rows_between_dp_sections_are_greedy_padding():
    # dp = 2 with 2 rows per rank: rank 0 holds one request, rank 1 one (rows 0 and 2)
    specs = [spec(temperature=0.7, seed=3, repetition_penalty=1.1), None, spec(seed=4, top_k=5)]
    config = sampler_config([s for s in specs if s is not None], valid_vocab_size=None)
    rows = build_rows(specs, [[1], [], [2, 3]], [[5], [], []], padded_rows=4, config=config)
    np.testing.assert_allclose(rows.temperature, [0.7, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(rows.top_k, [-1, -1, 5, -1])
    np.testing.assert_allclose(rows.repetition_penalty, [1.1, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(rows.num_generated, [1, 0, 0, 0])
    np.testing.assert_array_equal(rows.prompt_ids[2, :2], [2, 3])
    assert (rows.prompt_ids[1] == NO_TOKEN).all()
    keys = np.asarray(step_keys(jnp.asarray(rows.keys), jnp.asarray(rows.num_generated)))
    np.testing.assert_array_equal(keys[2], row_key(4, 0))


def test_min_new_tokens_without_stop_ids_needs_no_penalty_pass():
    assert not spec(min_new_tokens=3).needs_penalties
    assert spec(min_new_tokens=3, stop_ids=(2,)).needs_penalties
    assert spec(presence_penalty=0.5).needs_penalties


def test_one_batch_must_share_output_modes():
    with pytest.raises(ValueError, match="share their output modes"):
        sampler_config([spec(), spec(logprobs_mode="raw")], None)
    config = sampler_config([spec(entropy_top_k=8, top_logprobs=2)] * 2, None)
    assert (config.entropy_top_k, config.top_logprobs) == (8, 2)


def test_empty_batch_uses_the_default_config():
    config = sampler_config([], valid_vocab_size=None)
    assert config == sampler_config([spec()], None).__class__(penalties=False)


def test_more_requests_than_padded_rows_raise():
    config = sampler_config([], None)
    with pytest.raises(ValueError, match="do not fit"):
        build_rows([spec(), spec()], [[1], [1]], [[], []], padded_rows=1, config=config)


def test_extra_sampler_configs_are_what_such_requests_use():
    modes = [
        {"entropy_top_k": 8},  # no return_logprobs named: both
        {"entropy_top_k": 8, "return_logprobs": True},  # already there
        {"return_logprobs": True},  # the default config: compiled anyway
        {"top_logprobs": 3, "return_logprobs": False, "penalties": True},
    ]
    configs = extra_sampler_configs(modes, 1000)
    wanted = [
        sampler_config([spec(entropy_top_k=8)], 1000),
        sampler_config([spec(entropy_top_k=8, return_logprobs=False)], 1000),
        sampler_config(
            [spec(top_logprobs=3, return_logprobs=False, min_new_tokens=2, stop_ids=(5,))], 1000
        ),
    ]
    assert configs == tuple(wanted)
    assert wanted[2].penalties and not wanted[0].penalties
    assert sampler_config([], 1000) not in configs


@pytest.mark.parametrize("penalties", [False, True])
def test_packed_rows_unpack_to_the_same_batch_on_host_and_in_jit(penalties):
    specs = [
        spec(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, seed=2**40 + 3),
        None,
        spec(
            repetition_penalty=1.2,
            frequency_penalty=0.3,
            presence_penalty=-0.1,
            min_new_tokens=4,
            stop_ids=(7,),
            seed=9,
        ),
    ]
    config = dataclasses.replace(sampler_config([s for s in specs if s], None), penalties=penalties)
    rows = build_rows(specs, [[1, 2], [], [3]], [[4], [], [5, 6, 7]], 4, config)
    packed = pack_rows(rows)
    assert sum(x is not None for x in packed) == (6 if penalties else 3)  # arrays moved per step
    for unpacked in (unpack_rows(packed), jax.jit(unpack_rows)(packed)):
        for field in dataclasses.fields(rows):
            want, got = getattr(rows, field.name), getattr(unpacked, field.name)
            if want is None:
                assert got is None, field.name
                continue
            assert np.asarray(got).dtype == want.dtype, field.name
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=field.name)


def test_engine_rows_and_make_batch_build_the_same_batch():
    """One builder, one key convention: the engine's rows for seeded requests equal the
    device batch `make_batch` gives for the same options, ids and stop ids, padding aside."""
    from sgl_jax_rollout.sampling import make_batch

    options = [
        SamplingOptions(seed=3, temperature=0.7, repetition_penalty=1.3, min_new_tokens=2),
        SamplingOptions(seed=2**40 + 1, top_k=5, presence_penalty=0.5),
    ]
    specs = [RequestSpec(o, stop_ids=(7,)) for o in options]
    prompts, outputs = [[1, 2, 3], [4]], [[5], [6, 8]]
    rows = build_rows(specs, prompts, outputs, 2, sampler_config(specs, None))
    batch = make_batch(
        options, vocab_size=100, prompt_ids=prompts, output_ids=outputs, eos_token_ids=(7,)
    )
    for field in dataclasses.fields(batch):
        ours, theirs = getattr(rows, field.name), getattr(batch, field.name)
        assert (ours is None) == (theirs is None), field.name
        if ours is not None:
            np.testing.assert_array_equal(ours, np.asarray(theirs), err_msg=field.name)
