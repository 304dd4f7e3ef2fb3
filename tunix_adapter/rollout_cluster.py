"""`RolloutCluster`: tunix's `RLCluster` keeping what our learners read of a batch.

Its `generate` keeps what tunix 0.1.7's merge of micro-batches drops: it records each
micro-batch output of the rollout while tunix's own `generate` runs (nothing of it is copied),
and returns a `RolloutOutputWithEntropy` with the entropy (and a MoE's routed experts)
concatenated in the same order.

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
rows back (`_per_process`). Before each trainer update it hands the rollout engine's memory
to the trainer where asked (`memory_release.py`).

It must not build anything: `build_cluster` (`cluster.py`) loads the models and picks the
rollout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sgl_jax_rollout.rollout import RolloutOutputWithEntropy
from sgl_jax_rollout.tunix_compat import Mode, RLCluster, Role, put_params_on_memory_kind
from tunix_adapter.memory_release import RELEASES, release_for_update
from tunix_adapter.process_batch import global_batch, local_rows

# Per-sample fields of `RolloutOutputWithEntropy` that tunix's merge does not know.
OUR_ROW_FIELDS = ("entropy", "routed_experts", "prompt_routed_experts", "versions")


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
        """Frees the rollout engine's memory for the trainer's update (`release_for_update`),
        and buffers the bytes freed."""
        freed = release_for_update(self.rollout, self.release_rollout_memory, self._synced_params)
        if freed is None:
            return
        self.memory_released = freed
        total = freed["kv_bytes"] + freed["weight_bytes"]
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
