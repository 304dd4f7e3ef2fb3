"""Cluster wiring: one call builds tunix's `RLCluster` around our rollout (or the vanilla one).

`build_cluster` loads the actor (and reference, and a critic for PPO) from a model directory
(the built-in tiny model by default) on one mesh and picks the rollout engine:
`"sglang_jax"` (our `SglangJaxRollout`) or `"vanilla"` (`VanillaRolloutWithEntropy`), with the
model's tokenizer on a pad id safe for both (`pad_safe_tokenizer`).

Owns the building only. The cluster it returns is a `RolloutCluster` (`rollout_cluster.py`:
what the learners read of a batch, the anchor policy, per-process scoring); the rollout
engine's memory release before trainer updates is `memory_release.py`; LoRA adapters on the
actor are `actor_lora.py`. Their public names stay importable from here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from sgl_jax_rollout.tunix_compat import ClusterConfig, RLTrainingConfig, Role, create_critic_model
from tunix_adapter.actor_lora import LORA_MODULES, lora_scaling, with_lora
from tunix_adapter.logits_dtype import check_logits_dtype
from tunix_adapter.memory_release import RELEASES, release_option
from tunix_adapter.models import load_tunix_model, vocab_size
from tunix_adapter.rollout_cluster import OUR_ROW_FIELDS, RolloutCluster
from tunix_adapter.upstream_fixes import fix_sharing_check

__all__ = [
    "LORA_MODULES",
    "OUR_ROW_FIELDS",
    "RELEASES",
    "ROLLOUTS",
    "RolloutCluster",
    "build_cluster",
    "lora_scaling",
    "pad_safe_tokenizer",
    "with_lora",
]

ROLLOUTS = ("sglang_jax", "vanilla")


def build_cluster(
    *,
    rollout: str = "sglang_jax",
    model_path: str | Path | None = None,
    rollout_config: Any,
    training_config: RLTrainingConfig,
    mesh: jax.sharding.Mesh | None = None,
    engine_settings: Any = None,
    sampling: Any = None,
    with_reference: bool = True,
    with_critic: bool = False,
    preset: Any = None,
    lora: Mapping[str, Any] | None = None,
    release_rollout_memory: str | bool | None = True,
    partial_rollout: bool = False,
    max_staleness: int = 1,
    trainer_logits_dtype: str | None = None,
) -> RolloutCluster:
    """A `RolloutCluster` for `model_path` with the named rollout.

    Without a preset every role runs on `mesh` (default: one device). With a
    `tpu_configs.Preset`, the trainer roles run on its trainer mesh and the rollout on its
    rollout mesh, with its engine settings (`engine_settings`, a mapping, overrides them);
    the device count and the model's kv heads are checked first.

    `lora` ({"rank": r, "alpha": a, "module_path": regex, "seed": s}: qwix's `LoraProvider`
    fields and the adapters' init seed) trains LoRA adapters on the actor; the rollout serves
    them unmerged, on the engine's LoRA path (`sgl_jax_rollout.engine.lora`).

    `release_rollout_memory`: where the sgl-jax rollout shares the actor's devices, its engine
    frees its KV pool while the trainer updates ("kv"; True, the default, means "kv" there and
    None elsewhere), also its weights ("weights": they come back with the next weight sync),
    or keeps everything (False / None). On devices of its own it keeps everything; asking for
    a release there is refused by name.

    `partial_rollout` (sgl-jax rollout only): groups a training batch does not need are paused
    and continued at the next batch, under the weights of then, unless their oldest token is
    more than `max_staleness` policy versions old (`SglangJaxRollout`'s options of those
    names); the learner's `mask_offpolicy_in_partial_rollout` masks their older tokens.

    `trainer_logits_dtype` ("float32"; default None, tunix's model's): the actor's and
    reference's logits cast to float32 as they leave the model, as tunix main does
    (`load_tunix_model`'s `logits_dtype`): a bfloat16 Llama 3 / Gemma 2 / 3 on tunix 0.1.7
    then tempers and normalises them in float32, as the engine does.
    """
    if rollout not in ROLLOUTS:
        raise ValueError(f"rollout must be one of {ROLLOUTS}, got {rollout!r}")
    check_logits_dtype(trainer_logits_dtype, "trainer_logits_dtype")
    if partial_rollout and rollout != "sglang_jax":
        raise ValueError(f"partial_rollout needs rollout='sglang_jax', got {rollout!r}")
    from sgl_jax_rollout.tiny_model import default_model_dir

    model_path = Path(model_path) if model_path else default_model_dir()
    if preset is not None:
        if mesh is not None:
            raise ValueError("pass mesh or preset, not both: the preset names its meshes")
        preset.check_devices()
        preset.check_model(model_path)
        mesh, rollout_mesh = preset.meshes()
        settings = preset.engine_settings()
        if engine_settings:
            settings = settings.replace(**dict(engine_settings))
        engine_settings = settings
    else:
        # Auto axes: tunix's models index and gather without explicit output shardings.
        mesh = mesh or jax.make_mesh(
            (1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2
        )
        rollout_mesh = mesh
    if rollout == "sglang_jax":
        from sgl_jax_rollout.engine.availability import require_sgl_jax
        from sgl_jax_rollout.rollout import SglangJaxRollout

        require_sgl_jax()
        engine: Any = functools.partial(
            SglangJaxRollout,
            model_path=model_path,
            engine_settings=engine_settings,
            sampling=sampling,
            lora_scaling=lora_scaling(lora),
            partial_rollout=partial_rollout,
            max_staleness=max_staleness,
        )
    else:
        from tunix_adapter.vanilla import VanillaRolloutWithEntropy

        engine = VanillaRolloutWithEntropy
    load = functools.partial(load_tunix_model, model_path, mesh)
    actor = load(logits_dtype=trainer_logits_dtype)
    # A LoRA actor, or a family whose tunix and engine models split their weights
    # differently (Gemma's fused einsums), has another leaf count than the rollout's model.
    fix_sharing_check()
    if lora:
        actor = with_lora(actor, lora, mesh)
    critic = None
    if with_critic:
        critic = create_critic_model(load())
    shared = bool(set(rollout_mesh.devices.flat) & set(mesh.devices.flat))
    release = release_option(release_rollout_memory, rollout, shared=shared)
    config = ClusterConfig(
        role_to_mesh={role: rollout_mesh if role == Role.ROLLOUT else mesh for role in Role},
        rollout_engine=engine,
        training_config=training_config,
        rollout_config=rollout_config,
    )
    return RolloutCluster(
        actor=actor,
        critic=critic,
        reference=load(logits_dtype=trainer_logits_dtype) if with_reference else None,
        tokenizer=pad_safe_tokenizer(model_path, actor),
        cluster_config=config,
        release_rollout_memory=release,
    )


def pad_safe_tokenizer(model_path: Path, actor: Any) -> Any:
    """The model's tokenizer with the pad id both rollouts and tunix's learners use
    (`sgl_jax_rollout.pad_id`): never EOS, never an id a prompt holds."""
    from sgl_jax_rollout.pad_id import pad_safe
    from sgl_jax_rollout.rollout_inputs import eos_ids
    from sgl_jax_rollout.utils.model_dir import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    stops = eos_ids(model_path, tokenizer.eos_token_id)
    return pad_safe(tokenizer, vocab_size(actor.config), stops)
