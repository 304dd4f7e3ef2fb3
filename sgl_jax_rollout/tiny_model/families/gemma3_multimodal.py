"""The multimodal Gemma 3 family (`--like gemma-3-4b-it`): the replica of google/gemma-3-4b-it.

Owns its preset and `nest`, which lays the Gemma 3 text replica (`families.gemma3`: its config
keys and tensors) out as the multimodal checkpoints do: a `Gemma3ForConditionalGeneration`
(model_type `gemma3`) whose config.json nests the language model under `text_config` and whose
weights sit under `language_model.model.`, beside a vision tower and a projector that a
text-only rollout never loads.

What google/gemma-3-4b-it's config.json sets, kept at tiny sizes: its `text_config` names only
what differs from transformers' `Gemma3TextConfig` defaults (sizes, layers, window, the full
layers' linear RoPE scaling of factor 8) and no dtype (the checkpoint's `torch_dtype` is at the
top level), so head_dim 256, the query scale 256 ** -0.5, both RoPE bases, five windowed
layers to one full and the tied embedding all come from those defaults; two query heads to
each KV head (eight to four in the checkpoint); `<eos>` and `<end_of_turn>` stopping; the image
token ids; a SigLIP vision config. The window is 256 (1,024 in the checkpoint). The vision
tower is one tiny SigLIP layer (28-pixel images of 14-pixel patches), under HF's names.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from sgl_jax_rollout.tiny_model.families import gemma3
from sgl_jax_rollout.tiny_model.family import LikePreset

# The keys google/gemma-3-4b-it's text_config names; the replica names its head counts and
# vocabulary too (its tiny sizes are not the defaults). Everything else is a default.
TEXT_KEYS = (
    *("hidden_size", "intermediate_size", "model_type", "num_hidden_layers", "rope_scaling"),
    *("sliding_window", "num_attention_heads", "num_key_value_heads", "vocab_size"),
)
VISION = {  # SigLIP at tiny sizes; the checkpoint: 1,152 wide, 27 layers, 896-pixel images
    "hidden_size": 16,
    "image_size": 28,
    "intermediate_size": 32,
    "model_type": "siglip_vision_model",
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "patch_size": 14,
    "vision_use_head": False,
}

PRESET = LikePreset(
    arch="gemma3_multimodal",
    hf_repo="google/gemma-3-4b-it",
    config={
        **gemma3.PRESETS["gemma-3-1b-it"].config,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    },
    generation=gemma3.PRESETS["gemma-3-1b-it"].generation,
    eos_with_bos=False,
    head_dim=256,
    max_positions=32768,
)


def nest(text: dict[str, Any], tensors: dict[str, np.ndarray], seed: int) -> tuple[dict, dict]:
    """The multimodal layout of the text replica's config.json `text` and `tensors`: config.json
    (`text_config` holding `TEXT_KEYS` of `text`) and the weights, the text ones under
    `language_model.` and a seeded vision tower and projector beside them."""
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "eos_token_id": text["eos_token_id"],  # <eos> and <end_of_turn>
        "image_token_index": 262144,
        "initializer_range": 0.02,
        "mm_tokens_per_image": 4,  # (28 / 14) ** 2 patches, one token each
        "model_type": "gemma3",
        "text_config": {key: text[key] for key in TEXT_KEYS if key != "model_type"}
        | {"model_type": "gemma3_text"},
        "vision_config": VISION,
    }
    nested = {"language_model." + name: t for name, t in tensors.items()}
    return config, nested | _vision_tensors(text["hidden_size"], np.random.default_rng(seed + 1))


def _vision_tensors(text_hidden: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One SigLIP layer, its embeddings and post norm, and the projector, under HF's names."""
    width, inner, patch = VISION["hidden_size"], VISION["intermediate_size"], VISION["patch_size"]
    patches = (VISION["image_size"] // patch) ** 2

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    vision = "vision_tower.vision_model."
    layer = vision + "encoder.layers.0."
    tensors = {
        vision + "embeddings.patch_embedding.weight": normal(width, 3, patch, patch),
        vision + "embeddings.patch_embedding.bias": normal(width),
        vision + "embeddings.position_embedding.weight": normal(patches, width),
        vision + "post_layernorm.weight": 1 + normal(width),
        vision + "post_layernorm.bias": normal(width),
        "multi_modal_projector.mm_input_projection_weight": normal(width, text_hidden),
        "multi_modal_projector.mm_soft_emb_norm.weight": normal(width),
    }
    for norm in ("layer_norm1", "layer_norm2"):
        tensors[f"{layer}{norm}.weight"] = 1 + normal(width)
        tensors[f"{layer}{norm}.bias"] = normal(width)
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        tensors[f"{layer}self_attn.{proj}.weight"] = normal(width, width)
        tensors[f"{layer}self_attn.{proj}.bias"] = normal(width)
    for name, shape in (("fc1", (inner, width)), ("fc2", (width, inner))):
        tensors[f"{layer}mlp.{name}.weight"] = normal(*shape)
        tensors[f"{layer}mlp.{name}.bias"] = normal(shape[0])
    return tensors


FAMILY = dataclasses.replace(
    gemma3.FAMILY,
    arch="gemma3_multimodal",
    architecture="Gemma3ForConditionalGeneration",
    model_type="gemma3",
    presets={"gemma-3-4b-it": PRESET},
    nest=nest,
)
