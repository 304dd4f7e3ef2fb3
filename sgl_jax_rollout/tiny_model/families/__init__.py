"""The tiny model's architecture families: one module each, listed once in `FAMILIES`.

Owns the registry. A family module defines a `FAMILY` (`tiny_model.family.Family`: config.json
names, `--like` presets, vocabulary and the hooks where it leaves the shared layout); adding a
family is a new module here and a line below. The order is the order of `--arch` and `--like`
in the CLI's help.
"""

from __future__ import annotations

from sgl_jax_rollout.tiny_model.families import (
    gemma2,
    gemma3,
    gemma3_multimodal,
    gemma4,
    llama,
    qwen2,
    qwen3,
    qwen3_moe,
)
from sgl_jax_rollout.tiny_model.family import Family

FAMILIES: dict[str, Family] = {
    family.arch: family
    for family in (
        qwen3.FAMILY,
        qwen2.FAMILY,
        llama.FAMILY,
        gemma2.FAMILY,
        qwen3_moe.FAMILY,
        gemma4.FAMILY,
        gemma3.FAMILY,
        gemma3_multimodal.FAMILY,
    )
}
