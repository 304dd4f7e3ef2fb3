"""The built-in tiny model: generated offline, deterministically, loadable by tunix and sgl-jax."""

from sgl_jax_rollout.tiny_model.builder import (
    ARCHITECTURES,
    DEFAULT_VOCAB,
    LIKE_PRESETS,
    LikePreset,
    default_model_dir,
    like_preset,
    make_tiny_model,
    real_size_model_dir,
)

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_VOCAB",
    "LIKE_PRESETS",
    "LikePreset",
    "default_model_dir",
    "like_preset",
    "make_tiny_model",
    "real_size_model_dir",
]
