"""Named fixes of tunix behaviour that would stop or silently mislead a run, applied once.

Owns `fix_sharing_check`: tunix's `rl.utils._is_same_state` (0.1.7 `tunix/rl/utils.py:91`,
unchanged on main at c7d8950f, `tunix/rl/utils.py:100`) maps `x is y` over the two models'
leaf lists and raises a pytree structure error when their lengths differ, which they do
whenever the actor carries LoRA adapters and the rollout's model does not. Every RL learner
calls it through `is_sharing_weights` in `RLLearner.__init__`. Models with different leaf
counts cannot share weights, so the fix answers False there and defers to tunix otherwise.

Must not change what tunix computes where it works; each fix checks that the function it
wraps is still there and raises naming it when not.
"""

from __future__ import annotations

import functools
from typing import Any

import jax


def fix_sharing_check() -> None:
    """Idempotent: `tunix.rl.utils._is_same_state` answers False for different leaf counts."""
    from sgl_jax_rollout.tunix_compat import rl_utils  # checks that _is_same_state exists

    original = rl_utils._is_same_state
    if getattr(original, "_sgl_jax_rollout_fix", False):
        return

    @functools.wraps(original)
    def is_same_state(s1: Any, s2: Any) -> bool:
        if len(jax.tree_util.tree_leaves(s1)) != len(jax.tree_util.tree_leaves(s2)):
            return False
        return original(s1, s2)

    is_same_state._sgl_jax_rollout_fix = True
    rl_utils._is_same_state = is_same_state
