"""Weight sync for the other tunix families (qwen2, llama3) on their own tiny engines.

Engine-marked. Each case starts and shuts down its own engine (one engine per process), so it
must not run while the session rollout is alive: tests/conftest.py runs such tests before
the first test that uses it.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tunix_state_of_each_family_maps_onto_the_engine(arch, tmp_path):
    from flax import nnx

    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from tests.conftest import perturbed, small_engine_settings
    from tunix_adapter.models import load_tunix_model

    if patches.current() is not None:
        pytest.skip("another engine is still running in this process")
    model_dir = make_tiny_model(tmp_path / arch, arch=arch)
    trainer = load_tunix_model(model_dir)
    rollout = SglangJaxRollout(
        model_path=model_dir,
        engine_settings=small_engine_settings(
            max_running_requests=4,
            precompile_bs_paddings=(1, 4),
            precompile_token_paddings=(256,),
            max_prefill_tokens=512,
            context_length=256,
            max_total_tokens=4096,
        ),
    )
    try:
        rc = RolloutConfig(max_tokens_to_generate=8, max_prompt_length=16, temperature=0.0)
        loaded = rollout.generate(["hello there"], rc).tokens[0].tolist()
        state = nnx.state(trainer, nnx.Param)
        rollout.update_params(state)  # the same weights through tunix's mapping
        assert rollout.generate(["hello there"], rc).tokens[0].tolist() == loaded
        rollout.update_params(perturbed(state))
        assert rollout.generate(["hello there"], rc).tokens[0].tolist() != loaded
    finally:
        rollout.shutdown()
