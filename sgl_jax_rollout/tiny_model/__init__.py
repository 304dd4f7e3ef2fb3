"""The built-in tiny model: generated offline, deterministically, loadable by tunix and sgl-jax."""

from sgl_jax_rollout.tiny_model.builder import (
    ARCHITECTURES,
    DEFAULT_VOCAB,
    default_model_dir,
    make_tiny_model,
)

__all__ = ["ARCHITECTURES", "DEFAULT_VOCAB", "default_model_dir", "make_tiny_model"]
