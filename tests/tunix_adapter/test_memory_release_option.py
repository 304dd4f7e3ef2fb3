"""`build_cluster`'s `release_rollout_memory` as the cluster takes it (no engine): on by
default only where the sgl-jax rollout shares the actor's devices; an explicit release where
it cannot free anything for the trainer is refused by name."""

from __future__ import annotations

import pytest

from tunix_adapter.memory_release import release_option as _memory_release


def test_the_default_releases_the_kv_pool_only_on_shared_devices():
    assert _memory_release(True, "sglang_jax", shared=True) == "kv"
    assert _memory_release(True, "sglang_jax", shared=False) is None
    assert _memory_release(True, "vanilla", shared=True) is None
    assert _memory_release(False, "sglang_jax", shared=True) is None
    assert _memory_release("weights", "sglang_jax", shared=True) == "weights"


@pytest.mark.parametrize(
    ("option", "kind", "shared", "match"),
    [
        ("weights", "sglang_jax", False, r"needs the sglang_jax rollout on the actor's devices"),
        ("kv", "vanilla", True, r"rollout 'vanilla'"),
        ("all", "sglang_jax", True, r"one of \('kv', 'weights'\), got 'all'"),
    ],
)
def test_a_release_that_cannot_help_is_refused_by_name(option, kind, shared, match):
    with pytest.raises(ValueError, match=match):
        _memory_release(option, kind, shared=shared)
