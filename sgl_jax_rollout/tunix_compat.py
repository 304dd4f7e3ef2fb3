"""The tunix names this package uses, imported in one place.

Targets tunix 0.1.7. tunix's main branch moved `RolloutConfig` to `tunix/common/configs.py`
(still re-exported by `base_rollout`) and renamed `RLCluster` to `RLEngine`: the next
release should need changes here only.
"""

from __future__ import annotations

from tunix.generate.tokenizer_adapter import TokenizerAdapter
from tunix.rl.rollout.base_rollout import BaseRollout, RolloutConfig, RolloutOutput

__all__ = ["BaseRollout", "RolloutConfig", "RolloutOutput", "TokenizerAdapter"]
