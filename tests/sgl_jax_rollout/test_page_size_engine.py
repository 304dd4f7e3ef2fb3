"""The engine tests of the paged machinery again at the TPU presets' KV page size (64), where
the rest of the suite runs at 1: a batch against the trainer, prefix-cache hits with shared
group prefill, early stop freeing aborted requests, partial rollouts across a weight update,
memory release and resume. The tests are the session engine's own (imported: the same
assertions), run on an engine of this module at page size 64 (the `rollout` and
`engine_rollout` fixtures below take the place of the suite's), once the session engine is
shut down (`after_session_engine`, tests/conftest.py: one engine per process). Sessions and a
MoE's routed experts run at both sizes in their own modules (`test_session_engine.py`,
`test_routing_replay_engine.py`), as `check` does for every family replica
(`test_families_engine.py`).
"""

from __future__ import annotations

import pytest

from tests.sgl_jax_rollout.engine.test_memory_release import (
    test_a_release_frees_the_kv_pool_and_a_resume_samples_as_before,
    test_released_weights_come_back_through_update_params,
)
from tests.sgl_jax_rollout.test_groups_engine import (
    test_a_groups_prompt_is_prefilled_once_and_the_samples_do_not_change,
    test_early_stop_returns_the_first_complete_groups_and_frees_the_rest,
    test_partial_rollout_continues_paused_groups_under_the_new_weights,
)
from tests.sgl_jax_rollout.test_rollout import (
    test_processed_logprobs_equal_tunix_trainer_recomputation,
)

pytestmark = [pytest.mark.engine, pytest.mark.after_session_engine]

PAGE_SIZE = 64  # tpu_configs' presets: 64 or 128

__all__ = [
    "test_a_groups_prompt_is_prefilled_once_and_the_samples_do_not_change",
    "test_a_release_frees_the_kv_pool_and_a_resume_samples_as_before",
    "test_early_stop_returns_the_first_complete_groups_and_frees_the_rest",
    "test_partial_rollout_continues_paused_groups_under_the_new_weights",
    "test_processed_logprobs_equal_tunix_trainer_recomputation",
    "test_released_weights_come_back_through_update_params",
]


@pytest.fixture(scope="module")
def rollout(tiny_dir):
    from sgl_jax_rollout.engine import patches
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tests.conftest import small_engine_settings

    assert patches.current() is None, "the session engine is still running"
    worker = SglangJaxRollout(
        model_path=tiny_dir, engine_settings=small_engine_settings(page_size=PAGE_SIZE)
    )
    assert worker.engine.model_runner.token_to_kv_pool_allocator.page_size == PAGE_SIZE
    yield worker
    worker.shutdown()


@pytest.fixture(scope="module")
def engine_rollout(rollout):
    return rollout
