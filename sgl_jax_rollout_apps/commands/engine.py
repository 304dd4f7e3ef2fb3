"""The first step of every subcommand that starts the engine: is sgl-jax importable?

Owns `engine_missing` only; what to run on the engine is each subcommand's.
"""

from __future__ import annotations

import sys


def engine_missing(hint: str | None = None) -> bool:
    """True (after saying how to install it) when sgl-jax cannot be imported."""
    from sgl_jax_rollout.engine.availability import require_sgl_jax

    try:
        require_sgl_jax()
    except ImportError as err:
        print(f"sgl-jax-rollout: {err}", file=sys.stderr)
        if hint:
            print(hint, file=sys.stderr)
        return True
    return False
