"""Which sgl-jax we need and how to get it; importable without sgl-jax or its dependencies.

Owns the pinned upstream commit (DESIGN.md section 2), the install command users are given,
and `require_sgl_jax`, the check every entry point runs before touching the engine.
"""

from __future__ import annotations

PINNED_COMMIT = "cddbf6f1cc33cbdd453bd8f36ff7051cf46ca176"
INSTALL_HINT = (
    'pip install "sglang-jax[cpu] @ git+https://github.com/sgl-project/sglang-jax@'
    f'{PINNED_COMMIT}#subdirectory=python"  (use [tpu] on TPU)'
)


def require_sgl_jax() -> None:
    """Raises ImportError with the install command when sgl-jax is not importable."""
    try:
        import sgl_jax  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"sgl-jax is not installed (it is not on PyPI at a usable version). Install it "
            f"with: {INSTALL_HINT}"
        ) from err
