"""SamplingOptions validation: every bad field raises ValueError naming field and range."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout.sampling import SamplerConfig, SamplingOptions, config_for, make_batch, sample
from sgl_jax_rollout.utils.compiles import count_compiles

BAD = [
    ("temperature", -0.1, r"temperature must be a finite number in \[0.0, inf\]"),
    ("temperature", math.nan, "temperature"),
    ("temperature", math.inf, "temperature"),
    ("top_p", 0.0, r"top_p must be a finite number in \(0.0, 1.0\]"),
    ("top_p", 1.5, r"top_p .*got 1.5"),
    ("top_p", math.nan, "top_p"),
    ("top_k", 0, r"top_k must be -1 \(disabled\) or an integer >= 1"),
    ("top_k", -2, "top_k"),
    ("top_k", 2.5, "top_k"),
    ("min_p", -0.1, r"min_p must be a finite number in \[0.0, 1.0\]"),
    ("min_p", 1.1, "min_p"),
    ("repetition_penalty", 0.0, r"repetition_penalty must be a finite number in \(0.0, inf\]"),
    ("repetition_penalty", -1.0, "repetition_penalty"),
    ("repetition_penalty", math.nan, "repetition_penalty"),
    ("frequency_penalty", 2.5, r"frequency_penalty must be a finite number in \[-2.0, 2.0\]"),
    ("presence_penalty", math.nan, "presence_penalty"),
    ("min_new_tokens", -1, "min_new_tokens must be an integer >= 0"),
    ("n", 0, "n must be an integer >= 1"),
    ("entropy_top_k", -1, "entropy_top_k must be an integer >= 0"),
    ("top_logprobs", 21, "top_logprobs must be an integer >= 0 and <= 20"),
    ("logprobs_mode", "sampled", r"logprobs_mode must be one of \['processed', 'raw'\]"),
    ("entropy_source", "logits", r"entropy_source must be one of \['raw', 'processed'\]"),
    ("seed", -3, "seed must be an integer >= 0"),
    ("stop_token_ids", [1, -2], "stop_token_ids must hold integer token ids >= 0"),
    ("stop", [""], "stop must hold non-empty strings"),
    ("ignore_eos", 1, "ignore_eos must be True or False"),
    ("no_stop_trim", "yes", "no_stop_trim must be True or False"),
    ("include_stop_str_in_output", 0, "include_stop_str_in_output must be True or False"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD)
def test_bad_field_raises_naming_field_and_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingOptions(**{field: value})


def test_entropy_top_k_larger_than_vocab_raises():
    opts = SamplingOptions(entropy_top_k=500)
    with pytest.raises(ValueError, match=r"entropy_top_k must be in \[0, 100\]"):
        opts.validate_for_vocab(100)
    with pytest.raises(ValueError, match="entropy_top_k"):
        make_batch([opts], vocab_size=100, keys=np.zeros((1, 2)))


def test_replace_rejects_unknown_fields_and_validates():
    opts = SamplingOptions()
    assert opts.replace(top_k=5).top_k == 5
    with pytest.raises(ValueError, match=r"unknown sampling option\(s\) \['topk'\]"):
        opts.replace(topk=5)
    with pytest.raises(ValueError, match="top_p"):
        opts.replace(top_p=2.0)


def test_lists_become_tuples_and_options_hash():
    opts = SamplingOptions(stop=["a", "b"], stop_token_ids=[1, 2])
    assert opts.stop == ("a", "b") and opts.stop_token_ids == (1, 2)
    assert hash(opts) == hash(SamplingOptions(stop=("a", "b"), stop_token_ids=(1, 2)))


def test_rows_with_different_static_modes_cannot_share_a_batch():
    with pytest.raises(ValueError, match="rows of one batch must share logprobs_mode"):
        config_for([SamplingOptions(), SamplingOptions(logprobs_mode="raw")])


def test_bad_options_raise_before_anything_is_compiled():
    logits = jnp.zeros((1, 100), jnp.float32)
    batch = make_batch([SamplingOptions(seed=1)], vocab_size=100)
    with count_compiles() as compiles:
        with pytest.raises(ValueError, match="entropy_top_k"):
            make_batch([SamplingOptions(entropy_top_k=101)], vocab_size=100)
        with pytest.raises(ValueError, match="entropy_top_k must be in"):
            sample(logits, batch, SamplerConfig(entropy_top_k=101))
    assert compiles.count == 0
    # The counter does see compiles: a valid config compiles.
    with count_compiles() as compiles:
        sample(logits, batch, SamplerConfig(entropy_top_k=100)).tokens.block_until_ready()
    assert compiles.count >= 1
