"""RoPE phases rounded the way a trainer rounds them.

Owns `TRAINER_RULES` / `trainer_rule` (which of the rules below tunix's model for a
config.json `model_type` uses: upstream's where tunix has no model for it, `TUNIX_MODEL_TYPES`),
`described` (the rule an engine applies, in words, for `check`) and `cos_sin` (a rotary
embedding's cos and sin under a rule).
Nothing here imports sgl-jax or this project.

The phase of position p at frequency i is p * base ** (-2i / d). Peers round it three ways in
float32, each a different last bit of the phase for about half of the (p, i) pairs (one ulp of
a phase is 6e-5 rad at p = 1,000 and 1e-3 rad at p = 8,192):
- "inv_freq": p times inverse frequencies computed once in numpy float32 (sgl-jax's
  `RotaryEmbedding._compute_cos_sin`, checked against sgl-project/sglang-jax cddbf6f1
  `layers/embeddings.py:251-255`; transformers computes them the same way in torch);
- "timescale": p divided by `base ** (2i / d)` evaluated by XLA in the program, then by a
  linear scaling factor (tunix's gemma, gemma3, llama3 and qwen3 `apply_rope`);
- "inverse_timescale": p times `1 / base ** (2i / d)` evaluated by XLA (tunix's qwen2
  `_generate_pos_embeddings`).
XLA's float32 pow and numpy's differ in the last bit for some i, so only the trainer's formula
evaluated by XLA, as the trainer evaluates it, gives its phases bit for bit, on any backend
(trainer and engine run on the same one). The difference is rounding, not accuracy: neither
side's phases are nearer the exact ones. It matters on long contexts of large-activation
models: on Gemma 3 270M at 1,000-token prompts it was most of the gap between the engine's
logprobs and the trainer's (docs/guide.md).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

# config.json model_type -> the rule of tunix's model for it (google-tunix 0.1.7, main c7d8950f:
# `models/qwen2/model.py` `_generate_pos_embeddings`); every other tunix model divides by the
# timescale (`models/{gemma,gemma3,llama3,qwen3}/model.py` `apply_rope`).
TRAINER_RULES = {"qwen2": "inverse_timescale"}
# The config.json model_types tunix has a model for (`tunix_adapter/models.py` loads these; a
# test keeps the two lists equal). Elsewhere (phi3, mistral, internlm3, ...) there is no
# trainer's rounding to follow: "trainer" keeps upstream's.
TUNIX_MODEL_TYPES = frozenset(
    {"qwen2", "qwen3", "qwen3_moe", "llama", "gemma2", "gemma3", "gemma3_text", "gemma4"}
)


def trainer_rule(model_type: str) -> str:
    """The rule tunix's model for `model_type` computes its phases with; upstream's
    ("inv_freq") where tunix has no model for it."""
    if model_type not in TUNIX_MODEL_TYPES:
        return "inv_freq"
    return TRAINER_RULES.get(model_type, "timescale")


def described(model_type: str, setting: str) -> str:
    """The phases an engine with `EngineSettings.rope_phases == setting` computes for a
    checkpoint of `model_type`, in words (RoPE with frequencies of its own, as llama3 scaling,
    is upstream's under both)."""
    if setting != "trainer":
        return "sgl-jax's (rope_phases='sgl-jax')"
    rule = trainer_rule(model_type)
    if rule == "inv_freq":
        return f"sgl-jax's (tunix has no {model_type!r} model: no trainer's rounding to follow)"
    return f"tunix's {model_type} model's ({rule.replace('_', ' ')})"


def cos_sin(
    positions: Int[Array, " tokens"],
    rotary_dim: int,
    base: float,
    rule: str,
    scaling_factor: float = 1.0,
) -> tuple[Float[Array, "tokens half"], Float[Array, "tokens half"]]:
    """cos and sin of the phases of `positions` over `rotary_dim // 2` frequencies of `base`,
    rounded by `rule` ("timescale" or "inverse_timescale"), positions divided by a linear
    `scaling_factor` ("timescale" only: tunix divides the phase by it)."""
    fraction = 2 * jnp.arange(0, rotary_dim // 2) / rotary_dim
    timescale = base**fraction
    if rule == "timescale":
        phase = positions.astype(jnp.int32)[..., None] / timescale
        phase = phase / scaling_factor
    elif rule == "inverse_timescale":
        if scaling_factor != 1.0:
            raise ValueError(
                f"rule 'inverse_timescale' has no linear scaling, got factor {scaling_factor}"
            )
        phase = positions.astype(jnp.float32)[..., None] * (1.0 / timescale)
    else:
        raise ValueError(f"rule must be 'timescale' or 'inverse_timescale', got {rule!r}")
    return jnp.cos(phase), jnp.sin(phase)
