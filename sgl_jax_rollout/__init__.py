"""sgl-jax-rollout, engine side: the jitted sampler, the engine, the rollout, the tiny model.

Heavy modules (jax) load on first use, so `import sgl_jax_rollout` stays cheap and the CLI
can report a missing dependency cleanly. Imports neither the trainer side (`tunix_adapter`)
nor the applications (`sgl_jax_rollout_apps`): tests/test_layout.py checks it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "SamplingOptions": "sgl_jax_rollout.sampling.options",
    "EngineSettings": "sgl_jax_rollout.engine.settings",
    "SglangJaxRollout": "sgl_jax_rollout.rollout",
    "RolloutOutputWithEntropy": "sgl_jax_rollout.rollout",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sgl_jax_rollout' has no attribute {name!r}")
