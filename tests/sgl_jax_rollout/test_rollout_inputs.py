"""RolloutConfig translation, per-sample seeds, prompt padding and completion lengths."""

from __future__ import annotations

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.tunix_compat import RolloutConfig


def test_rollout_config_fields_then_overrides_make_the_options():
    defaults = SamplingOptions(repetition_penalty=1.1)
    rc = RolloutConfig(temperature=0.7, top_p=None, top_k=None, return_logprobs=False)
    options = inputs.options_for_call(defaults, rc, {"min_p": 0.05, "n": 2})
    assert (options.temperature, options.top_p, options.top_k) == (0.7, 1.0, -1)
    assert (options.min_p, options.n, options.repetition_penalty) == (0.05, 2, 1.1)
    assert options.return_logprobs is False
    rc = RolloutConfig(temperature=1.0, top_p=0.9, top_k=40)
    assert inputs.options_for_call(defaults, rc, {}).top_k == 40


@pytest.mark.parametrize("bad", [{"top_p": 0.0}, {"unknown": 1}, {"seed": 3}, {"n": 0}])
def test_invalid_overrides_raise_value_error(bad):
    with pytest.raises(ValueError):
        inputs.options_for_call(SamplingOptions(), RolloutConfig(), bad)


def test_int_seed_gives_every_row_its_own_reproducible_seed():
    fresh = np.random.default_rng(0)
    seeds = inputs.sample_seeds(5, num_prompts=3, n=2, fresh=fresh)
    assert len(set(seeds)) == 6
    assert seeds == inputs.sample_seeds(5, 3, 2, np.random.default_rng(1))


def test_per_prompt_seeds_keep_sample_zero_and_derive_the_others():
    seeds = inputs.sample_seeds([10, 20], num_prompts=2, n=3, fresh=np.random.default_rng())
    assert seeds[0] == 10 and seeds[3] == 20
    assert len(set(seeds)) == 6
    # The same prompt seed gives the same samples in another call, with other prompts.
    again = inputs.sample_seeds([7, 20], num_prompts=2, n=3, fresh=np.random.default_rng())
    assert again[3:] == seeds[3:]


def test_missing_seed_draws_from_the_rollout_generator():
    a = inputs.sample_seeds(None, 2, 2, np.random.default_rng(3))
    b = inputs.sample_seeds(None, 2, 2, np.random.default_rng(3))
    assert a == b and len(set(a)) == 4


@pytest.mark.parametrize("seed", [5, None, "key"])
def test_process_shares_get_the_global_batchs_seeds(seed):
    """With one process per host, each process's rows get the seeds one process sampling the
    whole batch (4 prompts x 2) gives its rows: distinct across hosts, the same as one host."""
    if seed == "key":
        seed = jax.random.key(7)
    whole = inputs.sample_seeds(seed, 4, 2, np.random.default_rng(3))
    shares = [inputs.sample_seeds(seed, 2, 2, np.random.default_rng(3), (i, 2)) for i in (0, 1)]
    assert shares[0] + shares[1] == whole and len(set(whole)) == 8
    # per-prompt seeds are the caller's: used as given in every share
    assert inputs.sample_seeds([10, 20], 2, 2, np.random.default_rng(), (1, 2))[::2] == [10, 20]


@pytest.mark.parametrize("bad", [[1], [1, -2], [1.5, 2], "x"])
def test_bad_seeds_raise(bad):
    with pytest.raises(ValueError, match="seed"):
        inputs.sample_seeds(bad, 2, 1, np.random.default_rng())


def test_prompts_are_cut_from_the_left_and_left_padded():
    ids, dropped = inputs.truncate_left([1, 2, 3, 4, 5], 3)
    assert ids == [3, 4, 5] and dropped == 2
    padded = inputs.left_pad([[3, 4, 5], [7]], 4, pad_id=0)
    np.testing.assert_array_equal(padded, [[0, 3, 4, 5], [0, 0, 0, 7]])
    assert inputs.prompt_rows(padded, 0) == [[3, 4, 5], [7]]
    with pytest.raises(ValueError, match="more than the padded width"):
        inputs.left_pad([[1, 2, 3]], 2, 0)


def test_completions_end_at_the_first_eos_kept_or_at_padding():
    rows = np.asarray([[5, 6, 2, 7, 0], [5, 6, 0, 0, 0], [5, 6, 7, 8, 9]])
    assert inputs.completion_rows(rows, pad_id=0, eos_id=2) == [[5, 6, 2], [5, 6], [5, 6, 7, 8, 9]]
    values = inputs.right_pad_values([np.ones(3), np.ones(2), np.ones(5)], 5)
    assert values.dtype == np.float32 and values.sum(1).tolist() == [3, 2, 5]


def test_default_options_read_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_k": 0, "top_p": 0.95, "eos_token_id": [2, 9]})
    )
    options = inputs.default_options(tmp_path)
    assert (options.temperature, options.top_k, options.top_p) == (0.6, -1, 0.95)
    assert inputs.eos_ids(tmp_path, tokenizer_eos=2) == [2, 9]
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert inputs.default_options(tmp_path).temperature == 0.0
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 3.0}))
    with pytest.raises(ValueError, match="top_p"):
        inputs.default_options(tmp_path)


def test_default_options_without_a_file_are_the_library_defaults(tmp_path):
    assert inputs.default_options(tmp_path) == SamplingOptions()
    assert inputs.eos_ids(tmp_path, tokenizer_eos=4) == [4]


def test_right_pad_ids_pads_and_cuts_at_width():
    ids = inputs.right_pad_ids([[5, 6, 7], [], [1, 2, 3, 4, 9]], 4, pad_id=0)
    assert ids.dtype == np.int32
    assert ids.tolist() == [[5, 6, 7, 0], [0, 0, 0, 0], [1, 2, 3, 4]]


QWEN25_INSTRUCT_GENERATION = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
}


def test_generation_config_sampling_values_apply_only_when_opted_in(tmp_path, caplog):
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN25_INSTRUCT_GENERATION))
    with caplog.at_level("INFO", logger="sgl_jax_rollout.rollout_inputs"):
        plain = inputs.rollout_defaults(tmp_path, use_generation_config=False)
    assert plain == SamplingOptions()
    assert "repetition_penalty=1.05" in caplog.text
    assert "use_generation_config=True" in caplog.text
    opted = inputs.rollout_defaults(tmp_path, use_generation_config=True)
    assert opted.repetition_penalty == 1.05 and opted == inputs.default_options(tmp_path)
    # RolloutConfig's temperature / top_p / top_k win either way; the file's penalty stays.
    rc = types.SimpleNamespace(temperature=1.0, top_p=None, top_k=None, return_logprobs=True)
    call = inputs.options_for_call(opted, rc, {})
    assert (call.temperature, call.top_p, call.top_k, call.repetition_penalty) == (
        1.0,
        1.0,
        -1,
        1.05,
    )
    assert inputs.options_for_call(plain, rc, {}).repetition_penalty == 1.0


def test_library_defaults_log_nothing_when_the_file_changes_no_sampling_value(tmp_path, caplog):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    with caplog.at_level("INFO", logger="sgl_jax_rollout.rollout_inputs"):
        assert inputs.rollout_defaults(tmp_path, use_generation_config=False) == SamplingOptions()
    assert caplog.text == ""


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_a_jax_prng_key_seed_is_one_stream(make_key):
    """tunix declares `RolloutConfig.seed` a jax.Array and its samplers read it as a key; two
    words of raw key data must not be read as seeds of two prompts."""
    seeds = inputs.sample_seeds(make_key(3), num_prompts=2, n=2, fresh=np.random.default_rng())
    assert len(set(seeds)) == 4 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == inputs.sample_seeds(make_key(3), 2, 2, np.random.default_rng(9))
    assert seeds != inputs.sample_seeds(make_key(4), 2, 2, np.random.default_rng())
    assert seeds != inputs.sample_seeds(3, 2, 2, np.random.default_rng())
    # An int-typed array is still one seed per prompt.
    per_prompt = inputs.sample_seeds(jnp.asarray([10, 20]), 2, 1, np.random.default_rng())
    assert per_prompt == [10, 20]
    with pytest.raises(ValueError, match="single key"):
        inputs.sample_seeds(jax.random.split(jax.random.key(0), 2), 2, 1, np.random.default_rng())


@pytest.mark.parametrize(
    ("eos", "match"),
    [
        ([1, 2.5], r"eos_tokens\[1\]"),
        ([50, -1], r"eos_tokens\[1\]"),
        ([99], r"\[0, 99\)"),
        ([True], r"eos_tokens\[0\]"),
        ("7", "list of token ids"),
        (7, "list of token ids"),
    ],
)
def test_eos_tokens_are_checked_against_the_vocabulary(eos, match):
    with pytest.raises(ValueError, match=match):
        inputs.eos_token_list(eos, vocab_size=99)


def test_valid_eos_tokens_pass_as_ints():
    assert inputs.eos_token_list(np.asarray([3, 98]), 99) == [3, 98]
    assert inputs.eos_token_list(None, 99) == [] and inputs.eos_token_list((), 99) == []


def test_a_bos_id_of_zero_is_kept():
    assert inputs.bos_prefix(0) == [0]
    assert inputs.bos_prefix(151643) == [151643]
    assert inputs.bos_prefix(None) == [] and inputs.bos_prefix(-1) == []


def test_sampler_modes_of_the_defaults_cover_both_logprob_choices_and_their_penalties():
    from sgl_jax_rollout.engine.rows import RequestSpec, extra_sampler_configs, sampler_config

    for defaults in (SamplingOptions(), SamplingOptions(repetition_penalty=1.1, entropy_top_k=4)):
        modes = inputs.sampler_modes(defaults)
        configs = set(extra_sampler_configs(modes, None)) | {sampler_config([], None)}
        for return_logprobs in (True, False):  # what a call with these defaults runs
            options = defaults.replace(seed=1, return_logprobs=return_logprobs)
            spec = RequestSpec(options, stop_ids=(2,))
            assert sampler_config([spec], None) in configs


def test_a_sampled_pad_ends_the_completion_as_a_stop():
    """`cut_at_pad` on the engine's `Completion` (its own dataclass, built here): what follows
    the pad (and for a session turn the pad too) leaves every per-token field and the routing
    rows of its inputs."""
    from sgl_jax_rollout.engine.collector import Completion

    routed = np.arange(4 + 5 - 1)[:, None]  # prompt 4, tokens 5: one row per input position
    done = Completion(
        rid="r",
        tokens=[7, 8, 0, 9, 0],
        logprobs=[-0.1, -0.2, -0.3, -0.4, -0.5],
        entropy=[1.0, 2.0, 3.0, 4.0, 5.0],
        top_logprob_ids=None,
        top_logprobs=None,
        finish_reason={"type": "length", "length": 5},
        routed_experts=routed,
    )
    cut = inputs.cut_at_pad(done, 0)  # the pad stays, as a stop token does
    assert cut.tokens == [7, 8, 0] and cut.logprobs == [-0.1, -0.2, -0.3]
    assert cut.entropy == [1.0, 2.0, 3.0] and cut.finish_reason == {"type": "stop", "matched": 0}
    np.testing.assert_array_equal(cut.routed_experts, routed[: 4 + 3 - 1])
    turn = inputs.cut_at_pad(done, 0, keep=False)  # a session turn: the pad goes too
    assert turn.tokens == [7, 8] and turn.logprobs == [-0.1, -0.2] and turn.entropy == [1.0, 2.0]
    np.testing.assert_array_equal(turn.routed_experts, routed[: 4 + 2 - 1])
    assert inputs.cut_at_pad(done, 5) is done and inputs.cut_at_pad(done, None) is done
    assert inputs.cut_at_pad(done, 7, keep=False).tokens == []


def test_prompt_list_takes_a_bare_string_as_one_prompt_and_names_what_it_refuses():
    """tunix 0.1.7's agentic learner passes one chat as a `str` (`agentic_rl_learner.py:455`);
    `VanillaRollout` takes it as one prompt, and so do we."""
    assert inputs.prompt_list("2 + 2 =") == ["2 + 2 ="]
    assert inputs.prompt_list(np.asarray(["a", "b"])) == ["a", "b"]
    with pytest.raises(ValueError, match="must not be empty"):
        inputs.prompt_list([])
    with pytest.raises(ValueError, match=r"not at index\(es\) \[1\]"):
        inputs.prompt_list(["a", 3])
    with pytest.raises(ValueError, match="list of strings, got int"):
        inputs.prompt_list(7)
