"""Cluster wiring: one call builds tunix's `RLCluster` around our rollout (or the vanilla one).

Owns `RolloutCluster`, an `RLCluster` whose `generate` keeps what tunix 0.1.7's merge of
micro-batches drops: it records each micro-batch output of the rollout while tunix's own
`generate` runs (nothing of it is copied), and returns a `RolloutOutputWithEntropy` with the
entropy (and a MoE's routed experts) concatenated in the same order.

tunix prepares training batches on its data thread and evaluation batches on the main thread,
at the same time where the rollout has devices of its own: what belongs to one batch is kept
per thread (a batch is produced on one thread, start to end). `batch_rollout` is this
thread's last result, the one the learners read; `last_rollout` the last of any thread (for
inspection); `answering_old_policy` makes this thread's `get_old_per_token_logps` calls answer
from the learner, `answering_generate` its `generate` calls (with rows the learner's dynamic
sampling already took through `generate_groups`), `answering_actor_logps` its
`get_actor_per_token_logps` calls (routing replay). It also snapshots the initial policy as
tunix's anchor state, so trainer-side logprobs of step 0 (`get_actor_per_token_logps`) are
available before the first sync (`snapshot_policy`; the learners call it again where the
rollout shares the actor's weights and tunix never syncs). With one JAX process per host,
its trainer scoring takes every process's share of the batch and gives each process its own
rows back (`_per_process`).

Where the rollout shares the actor's devices, its engine frees its KV pool (or also its
weights) before each trainer update and takes it back at its next call
(`release_rollout_memory`; the bytes are logged and buffered as
`rollout/memory_released_bytes`). A rollout call before the next weight sync (a step's next
mini-batch; async loading) gets the weights of the last sync back from tunix's anchor state,
the behaviour policy tunix expects; the sync itself brings the new ones.

`build_cluster` loads the actor (and reference, and a critic for PPO) from a model directory
(the built-in tiny model by default) on one mesh and picks the rollout engine:
`"sglang_jax"` (our `SglangJaxRollout`) or `"vanilla"` (`VanillaRolloutWithEntropy`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sgl_jax_rollout.rollout import RolloutOutputWithEntropy
from sgl_jax_rollout.tunix_compat import (
    ClusterConfig,
    Mode,
    RLCluster,
    RLTrainingConfig,
    Role,
    create_critic_model,
    put_params_on_memory_kind,
    reshard_model_to_mesh,
)
from tunix_adapter.models import load_tunix_model, vocab_size
from tunix_adapter.process_batch import global_batch, local_rows
from tunix_adapter.upstream_fixes import fix_sharing_check

logger = logging.getLogger(__name__)

ROLLOUTS = ("sglang_jax", "vanilla")


class RolloutCluster(RLCluster):
    def __init__(
        self, *args: Any, release_rollout_memory: str | None = None, **kwargs: Any
    ) -> None:
        """tunix's `RLCluster` plus what our learners read of a batch. `release_rollout_memory`
        ("kv", "weights" or None): before each trainer update the rollout engine frees its KV
        pool (and with "weights" its parameters), and takes them back at its next call
        (`SglangJaxRollout.release_memory(resume_on_use=True)`); None keeps them."""
        if release_rollout_memory not in RELEASES:
            raise ValueError(
                f"release_rollout_memory must be one of {RELEASES}, got {release_rollout_memory!r}"
            )
        super().__init__(*args, **kwargs)
        self.release_rollout_memory = release_rollout_memory
        self.memory_released: dict[str, int] | None = None  # the bytes of the last release
        self.last_rollout: RolloutOutputWithEntropy | None = None
        self._batch = threading.local()  # rollout parts, result, old-policy answer
        self._record_rollout_parts()
        if self._anchor_policy_state is None:
            self.snapshot_policy()

    @property
    def batch_rollout(self) -> RolloutOutputWithEntropy | None:
        """The last result of `generate` on this thread (the batch it is producing)."""
        return getattr(self._batch, "rollout", None)

    @contextlib.contextmanager
    def answering_old_policy(self, answer: Callable[..., Any]) -> Iterator[None]:
        """Within it, this thread's `get_old_per_token_logps` calls are answered by `answer`."""
        self._batch.old_policy = answer
        try:
            yield
        finally:
            self._batch.old_policy = None

    @contextlib.contextmanager
    def answering_actor_logps(self, answer: Callable[..., Any]) -> Iterator[None]:
        """Within it, this thread's `get_actor_per_token_logps` calls are answered by
        `answer` (tunix main scores the old policy there; routing replay scores it replayed)."""
        self._batch.actor_logps = answer
        try:
            yield
        finally:
            self._batch.actor_logps = None

    def get_old_per_token_logps(self, *args: Any, **kwargs: Any):
        answer = getattr(self._batch, "old_policy", None)
        if answer is not None:
            return answer(*args, **kwargs)
        return super().get_old_per_token_logps(*args, **kwargs)

    def update_actor(self, *args: Any, **kwargs: Any) -> Any:
        self._release_rollout_memory()
        return super().update_actor(*args, **kwargs)

    def update_critic(self, *args: Any, **kwargs: Any) -> Any:
        self._release_rollout_memory()
        return super().update_critic(*args, **kwargs)

    def _release_rollout_memory(self) -> None:
        """Frees the rollout engine's memory for the trainer's update, once per update run
        (the next rollout call takes it back)."""
        if self.release_rollout_memory is None or self.rollout.engine.released:
            return
        weights = self.release_rollout_memory == "weights"
        freed = self.rollout.release_memory(
            weights=weights, resume_on_use=True, restore=self._synced_params if weights else None
        )
        self.memory_released = freed
        total = freed["kv_bytes"] + freed["weight_bytes"]
        logger.info(
            "rollout engine released %.1f MiB for the trainer's update (KV pool %.1f, "
            "weights %.1f); it resumes at its next call",
            total / 2**20,
            freed["kv_bytes"] / 2**20,
            freed["weight_bytes"] / 2**20,
        )
        self.buffer_metrics({"rollout/memory_released_bytes": (total, np.mean)}, mode=Mode.TRAIN)

    def _record_rollout_parts(self) -> None:
        """Wraps the rollout's `generate` once: while a thread runs `generate` below, each
        micro-batch output the rollout returns to it is kept in that thread's parts."""
        rollout = self.rollout
        original = rollout.generate

        def recording(*a: Any, **k: Any):
            out = original(*a, **k)
            parts = getattr(self._batch, "parts", None)
            if parts is not None:
                parts.append(out)
            return out

        rollout.generate = recording

    def snapshot_policy(self) -> None:
        """Stores the actor's current weights as tunix's anchor state (what `sync_weights`
        stores), the weights `get_actor_per_token_logps` scores with."""
        self._anchor_policy_state = put_params_on_memory_kind(
            nnx.state(self.actor_trainer.model), "pinned_host"
        )

    def _synced_params(self) -> Any:
        """The actor's parameters at the last weight sync (tunix's anchor state, kept on the
        host), on the devices: what the rollout served before a weights release, and what a
        rollout call before the next sync (the next mini-batch, or async loading) serves."""
        return put_params_on_memory_kind(self._anchor_policy_state, "device").filter(nnx.Param)

    def anchor_model(self) -> Any:
        """The actor with tunix's anchor parameters (the weights the rollout sampled with,
        stored by `sync_weights` or `snapshot_policy`) on the devices, and its other state as
        it is now (a routing-replay slot added since the anchor was stored, for one)."""
        graphdef, _, rest = nnx.split(self.actor_trainer.model, nnx.Param, ...)
        return nnx.merge(graphdef, self._synced_params(), rest)

    def get_actor_per_token_logps(self, prompt_tokens, completion_tokens, *args, **kwargs):
        answer = getattr(self._batch, "actor_logps", None)
        if answer is not None:
            return answer(prompt_tokens, completion_tokens, *args, **kwargs)
        return self._per_process(
            super().get_actor_per_token_logps,
            Role.ACTOR,
            prompt_tokens,
            completion_tokens,
            *args,
            **kwargs,
        )

    def get_ref_per_token_logps(self, prompt_tokens, completion_tokens, *args, **kwargs):
        return self._per_process(
            super().get_ref_per_token_logps,
            Role.REFERENCE,
            prompt_tokens,
            completion_tokens,
            *args,
            **kwargs,
        )

    def _per_process(self, score, role, prompt_tokens, completion_tokens, *args, **kwargs):
        """Trainer scoring with one JAX process per host, where each process holds its own
        share of the batch (what its rollout sampled).

        tunix 0.1.7 assembles the global batch from the shares (`shard_input`) but then slices
        its micro-batches by the process-local batch size (`rl_cluster.py`,
        `get_ref_per_token_logps` / `get_actor_per_token_logps`: `batch_size =
        prompt_tokens.shape[0]`, then `dest_prompt_tokens[batch_slice]`): every process would
        score the first rows of the global batch, process 0's. Here the global batch goes in,
        and this process's rows of the result come back.
        """
        if jax.process_count() == 1:
            return score(prompt_tokens, completion_tokens, *args, **kwargs)
        prompts, completions = global_batch(
            [prompt_tokens, completion_tokens],
            self.cluster_config.role_to_mesh[role],
            tuple(self.cluster_config.training_config.data_sharding_axis),
        )
        result = score(prompts, completions, *args, **kwargs)
        return jnp.asarray(local_rows(result, prompt_tokens.shape[0]))

    @contextlib.contextmanager
    def answering_generate(self, output: RolloutOutputWithEntropy) -> Iterator[None]:
        """Within it, this thread's `generate` returns `output` (rows already sampled, one per
        prompt it is asked for) instead of sampling: the learner's dynamic sampling hands
        tunix the groups it kept."""
        self._batch.answer = output
        try:
            yield
        finally:
            self._batch.answer = None

    def generate_groups(
        self,
        prompts: list[str],
        *,
        mode: Mode,
        groups_needed: int,
        keys: list[Any],
        n: int,
        accept: Callable[[Any, list[str]], bool] | None = None,
    ) -> tuple[RolloutOutputWithEntropy, list[Any]]:
        """The rollout's `generate_groups` (`n` samples of every prompt, early stop once
        `groups_needed` groups are complete, or have passed `accept`) under the rollout config
        of `mode`."""
        if self.cluster_config.offload_to_cpu:
            raise ValueError(
                "dynamic sampling (generate_groups) does not run with ClusterConfig."
                "offload_to_cpu=True: the sgl-jax rollout keeps its own weights"
            )
        config = self.get_rollout_config(mode)
        return self.rollout.generate_groups(
            prompts, config, groups_needed, keys, accept=accept, n=n
        )

    def generate(self, prompts, *args: Any, **kwargs: Any) -> RolloutOutputWithEntropy:
        answer = getattr(self._batch, "answer", None)
        if answer is not None:
            if len(prompts) != len(answer.text):
                raise ValueError(
                    f"generate was asked for {len(prompts)} rows while answering with "
                    f"{len(answer.text)} sampled rows"
                )
            self._batch.rollout = self.last_rollout = answer
            return answer
        parts = self._batch.parts = []
        try:
            merged = super().generate(prompts, *args, **kwargs)
        finally:
            self._batch.parts = None
        fields = {f.name: getattr(merged, f.name) for f in dataclasses.fields(merged)}
        for name in OUR_ROW_FIELDS:
            if parts and all(getattr(p, name, None) is not None for p in parts):
                fields[name] = list(itertools.chain.from_iterable(getattr(p, name) for p in parts))
        result = RolloutOutputWithEntropy(**fields)
        self._batch.rollout = self.last_rollout = result
        return result


# Per-sample fields of `RolloutOutputWithEntropy` that tunix's merge does not know.
OUR_ROW_FIELDS = ("entropy", "routed_experts", "prompt_routed_experts")
RELEASES = (None, "kv", "weights")
LORA_MODULES = (
    ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"
    # Gemma's attention einsums (tunix's Gemma GRPO examples adapt these names)
    "|.*q_einsum|.*kv_einsum|.*k_einsum|.*qkv_einsum|.*attn_vec_einsum"
)


def lora_scaling(lora: Mapping[str, Any] | None) -> float | None:
    """qwix's LoRA scaling, alpha / rank (None without LoRA)."""
    if not lora:
        return None
    rank, alpha = lora.get("rank"), lora.get("alpha")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora rank must be an integer >= 1, got {rank!r}")
    if not isinstance(alpha, int | float) or alpha <= 0:
        raise ValueError(f"lora alpha must be > 0, got {alpha!r}")
    return float(alpha) / rank


def with_lora(model: Any, lora: Mapping[str, Any], mesh: jax.sharding.Mesh) -> Any:
    """`model` with qwix LoRA adapters (B = 0: the same function until trained), as tunix's
    own CLI applies them."""
    import qwix

    lora_scaling(lora)
    provider = qwix.LoraProvider(
        module_path=lora.get("module_path", LORA_MODULES), rank=lora["rank"], alpha=lora["alpha"]
    )
    adapted = qwix.apply_lora_to_model(
        model, provider, rngs=nnx.Rngs(lora.get("seed", 0)), **model.get_model_input()
    )
    return reshard_model_to_mesh(adapted, mesh)


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
    """
    if rollout not in ROLLOUTS:
        raise ValueError(f"rollout must be one of {ROLLOUTS}, got {rollout!r}")
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
    actor = load_tunix_model(model_path, mesh)
    # A LoRA actor, or a family whose tunix and engine models split their weights
    # differently (Gemma's fused einsums), has another leaf count than the rollout's model.
    fix_sharing_check()
    if lora:
        actor = with_lora(actor, lora, mesh)
    critic = None
    if with_critic:
        critic = create_critic_model(load_tunix_model(model_path, mesh))
    shared = bool(set(rollout_mesh.devices.flat) & set(mesh.devices.flat))
    release = _memory_release(release_rollout_memory, rollout, shared=shared)
    config = ClusterConfig(
        role_to_mesh={role: rollout_mesh if role == Role.ROLLOUT else mesh for role in Role},
        rollout_engine=engine,
        training_config=training_config,
        rollout_config=rollout_config,
    )
    return RolloutCluster(
        actor=actor,
        critic=critic,
        reference=load_tunix_model(model_path, mesh) if with_reference else None,
        tokenizer=pad_safe_tokenizer(model_path, actor),
        cluster_config=config,
        release_rollout_memory=release,
    )


def _memory_release(option: str | bool | None, rollout: str, shared: bool) -> str | None:
    """`build_cluster`'s `release_rollout_memory` as `RolloutCluster` takes it."""
    if option is True:
        return "kv" if shared and rollout == "sglang_jax" else None
    if option in (False, None):
        return None
    if option not in RELEASES:
        raise ValueError(
            f"release_rollout_memory must be True, False, None or one of {RELEASES[1:]}, got "
            f"{option!r}"
        )
    if rollout != "sglang_jax" or not shared:
        raise ValueError(
            f"release_rollout_memory={option!r} needs the sglang_jax rollout on the actor's "
            f"devices (here: rollout {rollout!r}, shared devices {shared}): a rollout on "
            "devices of its own frees nothing the trainer can use"
        )
    return option


def pad_safe_tokenizer(model_path: Path, actor: Any) -> Any:
    """The model's tokenizer with the pad id both rollouts and tunix's learners use
    (`sgl_jax_rollout.pad_id`): never EOS, never an id a prompt holds."""
    from sgl_jax_rollout.pad_id import pad_safe
    from sgl_jax_rollout.rollout_inputs import eos_ids
    from sgl_jax_rollout.utils.model_dir import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    stops = eos_ids(model_path, tokenizer.eos_token_id)
    return pad_safe(tokenizer, vocab_size(actor.config), stops)
