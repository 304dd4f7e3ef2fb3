"""sgl-jax-rollout, engine side: the jitted sampler, the tiny model, the CLI.

Heavy modules (jax) load on first use, so `import sgl_jax_rollout` stays cheap and the CLI
can report a missing dependency cleanly. Must not import `tunix_adapter`.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "SamplingOptions": "sgl_jax_rollout.sampling.options",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sgl_jax_rollout' has no attribute {name!r}")
