"""`load_tunix_model(..., logits_dtype="float32")` (`tunix_adapter.logits_dtype`): a bfloat16
tunix Llama 3 returns float32 logits, the values of its bfloat16 ones; tunix's own
`compute_per_token_logps` at T != 1 is then the log-softmax (float64 numpy) of the tempered
logits it computed; other models of the class are untouched. Unfixed (tunix 0.1.7), the same
weights give other logprobs: the bfloat16 rounding of the tempered logits. On tunix main the
model already casts (`compute_final_logits`) and is left as it is."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

LENGTH, TEMPERATURE = 24, 0.7


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from sgl_jax_rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("llama"), arch="llama")


@pytest.fixture(scope="module")
def models(llama_dir):
    """(float32 logits, as tunix returns them): two bfloat16 models of the same weights."""
    from tunix_adapter.models import load_tunix_model

    return (
        load_tunix_model(llama_dir, dtype=jnp.bfloat16, logits_dtype="float32"),
        load_tunix_model(llama_dir, dtype=jnp.bfloat16),
    )


def _casts_itself(model) -> bool:
    return hasattr(type(model), "compute_final_logits")  # tunix main


def _forward(model):
    tokens = jnp.asarray(np.random.default_rng(0).integers(10, 900, (2, LENGTH)), jnp.int32)
    mask = jnp.tril(jnp.ones((LENGTH, LENGTH), bool))[None]
    return model(tokens, jnp.arange(LENGTH)[None], None, mask)[0]


def test_the_logits_leave_in_float32_with_the_values_of_the_bfloat16_ones(models):
    fixed, as_tunix = models
    logits = _forward(fixed)
    assert logits.dtype == jnp.float32
    if _casts_itself(as_tunix):
        assert type(fixed) is type(as_tunix)
        return
    assert type(fixed) is not type(as_tunix) and isinstance(fixed, type(as_tunix))
    theirs = _forward(as_tunix)
    assert theirs.dtype == jnp.bfloat16  # the other model of the class is untouched
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(theirs, np.float32))
    graph, state = nnx.split(fixed)
    assert type(nnx.merge(graph, state)) is type(fixed)


def _scores(model):
    """tunix's logprobs of 32 completion tokens at `TEMPERATURE`, and the float64 log-softmax
    at those tokens of the tempered logits the same program returns."""
    from sgl_jax_rollout import tunix_compat

    rng = np.random.default_rng(1)
    prompts = jnp.asarray(rng.integers(10, 900, (2, 8)), jnp.int32)
    completions = jnp.asarray(rng.integers(10, 900, (2, 32)), jnp.int32)
    graph, state = nnx.split(model)
    logps, tempered = tunix_compat.per_token_logps_and_logits(
        graph, state, prompts, completions, pad_id=0, eos_id=1, temperature=TEMPERATURE
    )
    z = np.asarray(tempered, np.float64)
    z = z - z.max(-1, keepdims=True)
    own = z - np.log(np.exp(z).sum(-1, keepdims=True))
    own = np.take_along_axis(own, np.asarray(completions)[..., None], -1)[..., 0]
    return np.asarray(logps, np.float64), tempered.dtype, own


def test_tunix_tempers_and_normalises_the_float32_logits(models):
    fixed, as_tunix = models
    logps, dtype, own = _scores(fixed)
    assert dtype == jnp.float32
    np.testing.assert_allclose(logps, own, atol=2e-5)
    if not _casts_itself(as_tunix):  # tunix 0.1.7: bfloat16 logits tempered in bfloat16
        rounded, dtype, _ = _scores(as_tunix)
        assert dtype == jnp.bfloat16
        assert np.abs(rounded - logps).max() > 1e-3


def test_a_dtype_it_cannot_give_is_refused_by_name(llama_dir):
    from tunix_adapter.check_config import CheckConfig
    from tunix_adapter.models import load_tunix_model

    with pytest.raises(ValueError, match="logits_dtype must be one of"):
        load_tunix_model(llama_dir, logits_dtype="bfloat16")
    with pytest.raises(ValueError, match="trainer_logits_dtype must be one of"):
        CheckConfig(model_path=str(llama_dir), trainer_logits_dtype="float16")
