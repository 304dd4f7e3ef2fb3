"""Models: architectures sgl-jax lacks, registered in its model registry (catalog:
`patches/__init__.py`).

Owns `install` for `gemma3_text`: `Gemma3ForCausalLM` and `Gemma3ForConditionalGeneration`
(`engine/models/gemma3.py`) in
`ModelRegistry.models`, the table sgl-jax's model loader resolves a config's `architectures`
in (`models/registry.py`, `model_loader/arch.py:66-76`). Registered before the engine is
built, in this process, where the single-process engine loads its model.
"""

from __future__ import annotations

from sgl_jax_rollout.engine import upstream


def install() -> None:
    # Imported here: a model module builds on sgl-jax's layers when it is imported.
    from sgl_jax_rollout.engine.models import gemma3

    models = upstream.get("ModelRegistry").models
    for entry in gemma3.EntryClass:
        models[entry.__name__] = entry
