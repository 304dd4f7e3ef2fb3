"""Which sgl-jax we need and how to get it; importable without sgl-jax or its dependencies.

Owns the pinned upstream commit (docs/design.md section 2), the install commands users are
given (upstream repository, or a wheelhouse holding a wheel of that commit), and
`require_sgl_jax`, the check every entry point runs before touching the engine. The Makefile
reads `PINNED_COMMIT` from this file.
"""

from __future__ import annotations

PINNED_COMMIT = "cddbf6f1cc33cbdd453bd8f36ff7051cf46ca176"
# The version a wheel built unmodified from the pinned commit carries (setuptools-scm style).
WHEEL_VERSION = f"0.0.3.dev0+g{PINNED_COMMIT[:8]}"
INSTALL_HINT = (
    'pip install "sglang-jax[cpu] @ git+https://github.com/sgl-project/sglang-jax@'
    f'{PINNED_COMMIT}#subdirectory=python", or offline from a wheelhouse DIR: '
    f'pip install --find-links DIR "sglang-jax[cpu]=={WHEEL_VERSION}"  (use [tpu] on TPU)'
)


def require_sgl_jax() -> None:
    """Raises ImportError with the install commands when sgl-jax is not importable."""
    try:
        import sgl_jax  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"sgl-jax is not installed (it is not on PyPI at a usable version). Install it "
            f"with: {INSTALL_HINT}"
        ) from err
