"""Which `rope_scaling` types the engine's model applies: checked before the engine starts.

sgl-jax at the pinned commit (`availability.PINNED_COMMIT`, cddbf6f1) builds RoPE two ways:

- `srt/models/llama.py:162` (`LlamaForCausalLM`, also `Phi3ForCausalLM` and
  `InternLM3ForCausalLM`) calls `srt/layers/embeddings.py` `get_rope`, which applies a
  `rope_scaling` of type "proportional", "llama3" (with our patch `llama3_rope_scaling`) or
  "yarn" and raises on any other (`embeddings.py:661-720`);
- `srt/models/qwen2.py:130`, `qwen3.py:98` and `qwen3_moe.py:103` build a plain
  `RotaryEmbedding` from `rope_theta` and never read `rope_scaling`: a Qwen checkpoint with
  YaRN (as Qwen3 documents for long contexts) is served with unscaled RoPE, another function
  than the checkpoint's, whatever the trainer computes.

Our own `Gemma3ForCausalLM` and `Gemma3ForConditionalGeneration` (`engine/models/gemma3.py`,
registered by `patches.models`) apply "linear" on their full layers, as HF's Gemma 3 does (4B
and up: factor 8; a multimodal checkpoint names it in its `text_config`).

Owns `check_rope_scaling`: a ValueError naming `rope_scaling`, the architecture and what its
engine model applies, for a scaling it would not apply. `rope_type: "default"` (HF's spelling
of no scaling) is no scaling. An architecture missing from `APPLIED` is served with no
scaling only: nothing there was read. Extend `APPLIED` when the pin moves or a family lands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sgl_jax_rollout.engine.availability import PINNED_COMMIT
from sgl_jax_rollout.utils.model_dir import language_config

_GET_ROPE = ("llama3", "proportional", "yarn")
APPLIED: dict[str, tuple[str, ...]] = {
    "LlamaForCausalLM": _GET_ROPE,
    "Phi3ForCausalLM": _GET_ROPE,
    "InternLM3ForCausalLM": _GET_ROPE,
    "Qwen2ForCausalLM": (),
    "Qwen3ForCausalLM": (),
    "Qwen3MoeForCausalLM": (),
    "Gemma3ForCausalLM": ("linear",),
    "Gemma3ForConditionalGeneration": ("linear",),
}


def scaling_kind(model_config: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(whether `model_config` (a config.json) scales RoPE, the `rope_scaling` type it names):
    no `rope_scaling`, or one of type "default", is no scaling; a scaling without a type names
    None. The trainer side (`tunix_adapter.rope`) reads the config through this too."""
    scaling = model_config.get("rope_scaling")
    if not scaling:
        return False, None
    kind = scaling.get("rope_type", scaling.get("type"))
    return kind != "default", kind


def check_rope_scaling(model_config: Mapping[str, Any]) -> None:
    """Raises ValueError when `model_config` (a config.json) asks for a `rope_scaling` that the
    engine's model for its architecture does not apply (a multimodal checkpoint's scaling is
    its `text_config`'s)."""
    scaled, kind = scaling_kind(language_config(dict(model_config)))
    if not scaled:
        return
    architecture = (model_config.get("architectures") or ["(no architectures)"])[0]
    applied = APPLIED.get(architecture, ())
    if kind in applied:
        return
    raise ValueError(
        f"config.json rope_scaling of type {kind!r} is not applied by sgl-jax's "
        f"{architecture} model at the pinned commit {PINNED_COMMIT[:8]} (it applies "
        f"{list(applied) if applied else 'no rope_scaling'}): the engine would serve unscaled "
        "RoPE, another function than the checkpoint's"
    )
