"""`SglangJaxRollout`: tunix's `BaseRollout` on the in-process sgl-jax engine.

A thin adapter, like tunix's `VanillaRollout`: it turns prompts and `RolloutConfig` into
engine requests (`rollout_inputs` holds the rules) and engine completions into a
`RolloutOutput` with `entropy` added, aligned as docs/design.md section 4 says. Engine mechanics
live in `sgl_jax_rollout.engine`, sampling math in `sgl_jax_rollout.sampling`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.engine.lora import lora_layout, split_update
from sgl_jax_rollout.engine.settings import EngineSettings
from sgl_jax_rollout.pad_id import pad_safe
from sgl_jax_rollout.partial import Group, Member, PausedGroups
from sgl_jax_rollout.request_policy import RequestPolicy
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.tunix_compat import (
    BaseRollout,
    RolloutConfig,
    RolloutOutput,
    TokenizerAdapter,
)


@dataclasses.dataclass
class RolloutOutputWithEntropy(RolloutOutput):
    """tunix's `RolloutOutput` plus the per-token entropy of each sample (None if not asked)
    and, with `EngineSettings.return_routed_experts`, the experts each MoE layer routed each
    token to: `routed_experts[i]` `[len(tokens[i]), layers, top_k]`, aligned with the
    completion's tokens like its logprobs (row j: completion token j as the model's input;
    the last token is never an input, its row is -1), and `prompt_routed_experts[i]`
    `[prompt, layers, top_k]` for the sample's prompt tokens (unpadded)."""

    entropy: list[np.ndarray] | None = None
    routed_experts: list[np.ndarray] | None = None
    prompt_routed_experts: list[np.ndarray] | None = None
    # With partial rollouts: the policy version (`SglangJaxRollout.policy_version`) that
    # sampled each token, `[len(tokens[i])]`; its logprob is under that version.
    versions: list[np.ndarray] | None = None


class SglangJaxRollout(BaseRollout):
    """Rollout worker on sgl-jax with our sampler: tokens, logprobs and entropy per token.

    Built by tunix's cluster as `rollout_engine(rollout_actor=, tokenizer=, mesh=,
    rollout_config=)`; our own options come through `functools.partial`: `model_path` (an HF
    model directory; default: the built-in tiny model), `engine_settings` (`EngineSettings` or
    a dict), `sampling` (`SamplingOptions` or a dict: defaults for what `RolloutConfig` lacks,
    such as penalties, min_p, entropy settings), `use_generation_config` (take those defaults
    from generation_config.json first; off, since a checkpoint's sampling defaults would make
    every rollout off-policy), `sync_actor_weights` (serve `rollout_actor`'s weights from the
    start), `lora_scaling` (qwix's alpha / rank for a LoRA actor whose qwix rules cannot be
    read; they are read where they can be, per module). A LoRA actor's adapters are served
    unmerged, on sgl-jax's static LoRA path (`engine.lora`). `RolloutConfig`'s temperature /
    top_p / top_k always win. With a `mesh`, the engine uses its devices. `pad_id` (default:
    chosen, `sgl_jax_rollout.pad_id`) is the id handed to tunix for padding: never one a prompt
    or completion holds, so never EOS (checkpoints that ship pad = EOS get another id, logged).
    `partial_rollout` (slime `--partial-rollout`): `generate_groups` pauses the groups it does
    not need instead of dropping them, and continues them at its next call, after the weight
    update, first; `max_staleness` (default 1) drops a paused group whose oldest token is more
    policy versions old than that.
    Policies (BOS, stop and pad ids, seeds, limits) live in `request_policy`; this class
    translates tunix's vocabulary and nothing else.
    """

    def __init__(
        self,
        rollout_actor: Any = None,
        tokenizer: Any = None,
        mesh: Any = None,
        rollout_config: RolloutConfig | None = None,
        *,
        model_path: str | Path | None = None,
        engine_settings: EngineSettings | Mapping[str, Any] | None = None,
        sampling: SamplingOptions | Mapping[str, Any] | None = None,
        use_generation_config: bool = False,
        sync_actor_weights: bool = True,
        lora_scaling: float | None = None,
        seed: int = 0,
        pad_id: int | None = None,
        partial_rollout: bool = False,
        max_staleness: int = 1,
    ) -> None:
        from sgl_jax_rollout.engine.engine import RolloutEngine
        from sgl_jax_rollout.tiny_model import default_model_dir

        model_path = Path(model_path) if model_path is not None else default_model_dir()
        defaults = inputs.rollout_defaults(model_path, use_generation_config, sampling)
        self._rollout_config = rollout_config
        if lora_scaling is None:
            lora_scaling = getattr(rollout_config, "rollout_sglang_jax_lora_scaling", None)
        lora = lora_layout(rollout_actor, lora_scaling)
        self._model_path = model_path
        self._actor = rollout_actor
        settings = _settings(engine_settings, mesh)
        _check_partial(partial_rollout, max_staleness, settings)
        self._partial_rollout, self._max_staleness = partial_rollout, max_staleness
        self._paused = PausedGroups()
        self.policy_version = 0  # + 1 at every update_params
        self._engine = RolloutEngine(model_path, settings, inputs.sampler_modes(defaults), lora)
        try:  # a failure from here on must not leave the engine running
            raw = tokenizer or self._engine.tokenizer
            model_eos = inputs.eos_ids(model_path, TokenizerAdapter(raw).eos_id())
            self._tokenizer = pad_safe(raw, self._engine.vocab_size, model_eos, pad_id)
            self._policy = RequestPolicy(self._engine, self._tokenizer, model_eos, defaults, seed)
            if rollout_actor is not None and sync_actor_weights:
                self.update_params(nnx.state(rollout_actor, nnx.Param))
        except BaseException:
            self._engine.shutdown()
            raise

    @property
    def engine(self):
        return self._engine

    def get_default_sampling_params(self) -> SamplingOptions:
        """Options from the model's generation_config.json (library defaults where absent),
        whether or not the rollout applies them (`use_generation_config`)."""
        return inputs.default_options(self._model_path)

    def generate(
        self, prompts: list[str], rollout_config: RolloutConfig, **kwargs: Any
    ) -> RolloutOutputWithEntropy:
        """Samples completions; `kwargs` override any `SamplingOptions` field for this call."""
        return self._generate(prompts, rollout_config, None, kwargs)[0]

    def generate_groups(
        self,
        prompts: list[str],
        rollout_config: RolloutConfig,
        groups_needed: int,
        keys: list[Any] | None = None,
        max_tokens_per_sample: Sequence[int] | None = None,
        accept: Callable[[Any, list[str]], bool] | None = None,
        **kwargs: Any,
    ) -> tuple[RolloutOutputWithEntropy, list[Any]]:
        """Over-sampling with early stop: samples `n` completions of every prompt (a group)
        and returns as soon as `groups_needed` groups have all their samples finished; every
        other sample is aborted (its KV freed, nothing of it returned). With `accept` (slime's
        dynamic sampling), a finished group counts only when `accept(key, its texts)` is true,
        asked as groups finish while the engine goes on; a refused group is dropped. slime's
        `--over-sampling-batch-size` is `len(prompts)`, its `--rollout-batch-size`
        `groups_needed`. Returns the kept groups' output (prompt order, a group's samples
        adjacent, as `generate` lays them out) and the kept groups' keys: `keys[i]` names
        `prompts[i]` (default: its index). With partial rollouts a kept group may come from an
        earlier call, under the key that call gave it: give keys that tell calls apart; and
        `prompts` may be empty while groups are paused (the call continues those alone).
        `max_tokens_per_sample`: each new sample's own max new tokens (`len(prompts) * n`
        integers in [1, `max_tokens_to_generate`], a group's samples adjacent); a paused
        sample keeps its own across calls, capped by each call's limit.

        Early stop favours the groups that finish first, so short completions: the bias every
        over-sampling stack accepts for the wait it saves."""
        keys = list(range(len(prompts))) if keys is None else list(keys)
        if len(keys) != len(prompts):
            raise ValueError(f"keys has {len(keys)} entries for {len(prompts)} prompts")
        if self._partial_rollout:
            return self._generate_partial(
                prompts, rollout_config, groups_needed, keys, max_tokens_per_sample, kwargs, accept
            )
        by_index = None if accept is None else (lambda i, texts: accept(keys[i], texts))
        output, kept = self._generate(
            prompts, rollout_config, groups_needed, kwargs, max_tokens_per_sample, by_index
        )
        return output, [keys[i] for i in kept]

    @property
    def partial_rollout(self) -> bool:
        """Whether `generate_groups` pauses the groups it does not need (constructor option)."""
        return self._partial_rollout

    @property
    def paused_groups(self) -> int:
        """Groups a partial rollout holds for its next call."""
        return len(self._paused)

    @property
    def paused_keys(self) -> list[Any]:
        """The keys (as `generate_groups` was given them) of the paused groups the next call
        continues (not those it will drop as stale), oldest first; a caller keeps what it
        needs of those groups under them."""
        return self._paused.keys(self.policy_version, self._max_staleness)

    @property
    def dropped_stale_groups(self) -> int:
        """Paused groups dropped as older than `max_staleness` versions, so far."""
        return self._paused.dropped

    def _generate(
        self,
        prompts: list[str],
        rollout_config: RolloutConfig,
        groups_needed: int | None,
        kwargs: dict[str, Any],
        max_tokens_per_sample: Sequence[int] | None = None,
        accept: Callable[[int, list[str]], bool] | None = None,
    ) -> tuple[RolloutOutputWithEntropy, list[int]]:
        prompts = inputs.prompt_list(prompts)
        options, limit, max_prompt = self._policy.call(rollout_config, kwargs)
        limits = inputs.sample_limits(max_tokens_per_sample, len(prompts) * options.n, limit)
        seeds = self._policy.seeds(rollout_config.seed, len(prompts), options.n)
        prompt_ids = self.prompt_token_ids(prompts, max_prompt)
        self._policy.refuse_pad(prompt_ids)
        rows = [ids for ids in prompt_ids for _ in range(options.n)]
        groups = None if groups_needed is None else [i // options.n for i in range(len(rows))]
        judge = None
        if accept is not None:
            held = set(self._policy.stop_rules(options, rollout_config)[1])

            def judge(group: int, done: list[Any]) -> bool:
                return accept(group, [self._text(c.tokens, held) for c in done])

        completions, hold_back = self._policy.sample(
            rows,
            seeds,
            options,
            rollout_config,
            groups,
            groups_needed,
            limits=limits,
            accept=judge,
        )
        kept = sorted({i // options.n for i, c in enumerate(completions) if c is not None})
        rows = [r for r, c in zip(rows, completions, strict=True) if c is not None]
        completions = [c for c in completions if c is not None]
        stops = set(hold_back)
        output = RolloutOutputWithEntropy(
            text=[self._text(c.tokens, stops) for c in completions],
            logits=None,
            tokens=[np.asarray(c.tokens, np.int32) for c in completions],
            left_padded_prompt_tokens=inputs.left_pad(rows, max_prompt, self.pad_id()),
            logprobs=_per_row(completions, "logprobs") if options.return_logprobs else None,
            entropy=_per_row(completions, "entropy") if options.return_entropy else None,
            **_routing(completions, [len(r) for r in rows]),
        )
        return output, kept

    def _generate_partial(
        self,
        prompts: list[str],
        rollout_config: RolloutConfig,
        groups_needed: int,
        keys: list[Any],
        max_tokens_per_sample: Sequence[int] | None,
        kwargs: dict[str, Any],
        accept: Callable[[Any, list[str]], bool] | None = None,
    ) -> tuple[RolloutOutputWithEntropy, list[Any]]:
        """`generate_groups` with partial rollouts: the paused groups (continued first) and
        the new prompts' groups. With `accept`, the groups it refuses are dropped, and those
        complete but not yet judged when enough passed are paused, to be judged first next."""
        # no new prompt is fine while paused groups remain: they are the call's groups
        prompts = inputs.prompt_list(prompts) if len(prompts) or not len(self._paused) else []
        options, limit, max_prompt = self._policy.call(rollout_config, kwargs)
        _check_partial_options(options)
        limits = inputs.sample_limits(max_tokens_per_sample, len(prompts) * options.n, limit)
        seeds = self._policy.seeds(rollout_config.seed, len(prompts), options.n)
        prompt_ids = self.prompt_token_ids(prompts, max_prompt)
        self._policy.refuse_pad(prompt_ids)
        total = len(self._paused) + len(prompt_ids)
        if not 1 <= groups_needed <= total:
            raise ValueError(
                f"groups_needed must be in [1, {total}] (prompts and paused groups), got "
                f"{groups_needed}"
            )
        resumed = self._paused.resume(self.policy_version, self._max_staleness)
        groups = resumed + [
            Group(
                keys[i], ids, [_member(i * options.n + j, seeds, limits) for j in range(options.n)]
            )
            for i, ids in enumerate(prompt_ids)
        ]
        if len(groups) < groups_needed:
            self._paused.pause(resumed)
            raise ValueError(
                f"groups_needed is {groups_needed}, but after dropping paused groups older than "
                f"max_staleness={self._max_staleness} versions only {len(groups)} remain"
            )
        for member in (m for g in groups for m in g.members):
            member.done = member.done or len(member.tokens) >= member.budget(limit)
        stop_rule = self._policy.stop_rule(options, rollout_config)
        held = set(stop_rule.ids)  # the held-back stop ids (none with ignore_eos)
        # with `accept`: the groups judged, in the order they were; the others complete are
        # judged at a later call
        accepted: list[Group] = []
        refused: set[Group] = set()

        def judged(group: Group, tokens: list[list[int]]) -> bool:
            ok = bool(accept(group.key, [self._text(t, held) for t in tokens]))
            if ok:
                accepted.append(group)
            else:
                refused.add(group)
            return ok

        if accept is not None:
            for group in (g for g in groups if g.complete):
                judged(group, [m.tokens for m in group.members])
        ready = sum(g.complete and g not in refused for g in groups)
        if ready < groups_needed:
            running = [(g, m) for g in groups if not g.complete for m in g.members if not m.done]
            asks = [m.request(g.prompt, limit) for g, m in running]
            ids = {g: k for k, g in enumerate(dict.fromkeys(g for g, _ in running))}
            order = list(ids)

            def judge(index: int, done: list[Any]) -> bool:
                group = order[index]
                new = dict(zip([m for g, m in running if g is group], done, strict=True))
                tokens = [
                    m.preview(new[m], stop_rule) if m in new else m.tokens for m in group.members
                ]
                return judged(group, tokens)

            try:
                completions, _ = self._policy.sample(
                    [ask[0] for ask in asks],
                    [ask[2] for ask in asks],
                    options,
                    rollout_config,
                    groups=[ids[g] for g, _ in running],
                    need_groups=groups_needed - ready,
                    limits=[ask[1] for ask in asks],
                    keep_partial=True,
                    accept=None if accept is None else judge,
                )
            except BaseException:
                self._paused.pause(resumed)  # nothing paused is lost when a call fails
                raise
            for (_, member), done in zip(running, completions, strict=True):
                member.extend(done, self.policy_version, limit, stop_rule)
        complete = accepted if accept is not None else [g for g in groups if g.complete]
        kept = complete[:groups_needed]
        self._paused.pause([g for g in groups if g not in kept and g not in refused])
        members = [(g, m) for g in kept for m in g.members]
        rows = [g.prompt for g, _ in members]
        output = RolloutOutputWithEntropy(
            text=[self._text(m.tokens, held) for _, m in members],
            logits=None,
            tokens=[np.asarray(m.tokens, np.int32) for _, m in members],
            left_padded_prompt_tokens=inputs.left_pad(rows, max_prompt, self.pad_id()),
            logprobs=[np.asarray(m.logprobs, np.float32) for _, m in members]
            if options.return_logprobs
            else None,
            entropy=[np.asarray(m.entropy, np.float32) for _, m in members]
            if options.return_entropy
            else None,
            versions=[np.asarray(m.versions, np.int32) for _, m in members],
        )
        return output, [g.key for g in kept]

    def _text(self, tokens: Sequence[int], stops: set[int]) -> str:
        """A completion's text: its tokens decoded, the held-back stop ids left out."""
        return self._tokenizer.decode([t for t in tokens if t not in stops])

    def prompt_token_ids(self, prompts: list[str], max_prompt_length: int) -> list[list[int]]:
        """The ids `generate` sends for each prompt: one BOS where the tokenizer has one, cut
        from the left to `max_prompt_length` (with a warning)."""
        return [self._policy.prompt_ids(p, max_prompt_length, i) for i, p in enumerate(prompts)]

    def session(
        self, track_tree: bool = False, rollout_config: RolloutConfig | None = None, strict=False
    ):
        """A managed multi-turn session (`sgl_jax_rollout.session`) on this rollout.

        Use as `with rollout.session() as s:`; `s.complete(text or ids, n=, **overrides)`,
        `s.chat(messages, n=, **overrides)`, `s.chat_extend(node, new_messages, ...)`,
        `s.state()`, `s.trajectories()`. Sampling uses `rollout_config` (default: the
        constructor's) and per-call `SamplingOptions` overrides; prompts are never truncated (a
        too long one raises). `strict=True`: a prompt that extends no node raises (else warns).
        """
        from sgl_jax_rollout.session import Session

        config = rollout_config or self._rollout_config or RolloutConfig()
        sample = functools.partial(self._policy.sample_session, config)
        return Session(
            sample,
            self._engine.tokenizer,
            track_tree,
            strict,
            vocab_size=self._engine.vocab_size,
            start=self._policy.with_bos,
        )

    def get_per_token_logps(
        self,
        prompt_tokens: Int[Array, "batch prompt_len"],
        completion_tokens: Int[Array, "batch completion_len"],
    ) -> Float[Array, "batch completion_len"]:
        """Logprobs of the completion tokens under the engine's current weights (prefill only).

        Prompts are left-padded, completions right-padded with `pad_id`; a completion ends at
        its first EOS (kept). Positions past the end are 0.
        """
        prompts, completions, width = inputs.scoring_rows(
            prompt_tokens, completion_tokens, self.pad_id(), self.eos_id()
        )
        scores = self._engine.score(prompts, completions)
        return jnp.asarray(inputs.right_pad_values(scores, width))

    def update_params(self, params: Any, filter_types: tuple[Any, ...] | None = None) -> None:
        """Swaps in new weights (tunix nnx state or engine layout; `engine.weights`); LoRA
        factors go to the engine's LoRA buffers, unmerged (`engine.lora.split_update`)."""
        del filter_types  # the cluster already filtered the state it passes; names tell LoRA
        base, lora = split_update(params, self._actor)
        self._engine.update_weights(base, lora=lora)
        self.policy_version += 1

    def release_memory(
        self,
        weights: bool = False,
        resume_on_use: bool = False,
        restore: Callable[[], Any] | None = None,
    ) -> dict[str, int]:
        """Frees the engine's KV pool on the devices (and with `weights` its parameters) while
        the trainer runs; waits for a running call first. Returns the bytes freed
        (`{"kv_bytes": ..., "weight_bytes": ...}`). Until `resume_memory`, `generate`, scoring
        and sessions raise RuntimeError naming the release (`engine.memory`); with
        `resume_on_use` the first of them (or `update_params`) resumes first instead. With
        weights released, such a call needs `restore` (weights and resume_on_use only): it
        returns the state to serve again, as `update_params` takes it (the one last passed
        there: the policy version stays); without it the call raises until `update_params`."""
        back = None if restore is None else (lambda: split_update(restore(), self._actor))
        released = self._engine.release_memory(weights, resume_on_use, back)
        return {"kv_bytes": released.kv_bytes, "weight_bytes": released.weight_bytes}

    def resume_memory(self) -> None:
        """Brings the KV pool back, empty (the prefix cache was flushed), with the same shapes
        and shardings: nothing recompiles. After `release_memory(weights=True)` the next
        `update_params` must come before any `generate` (which raises until then)."""
        self._engine.resume_memory()

    @contextlib.contextmanager
    def released_memory(self, weights: bool = False):
        """`with rollout.released_memory(): train()`: released inside, resumed on the way out
        (also when the block raises). Yields `release_memory`'s byte counts."""
        freed = self.release_memory(weights)
        try:
            yield freed
        finally:
            self.resume_memory()

    def pad_id(self) -> int:
        return self._tokenizer.pad_id()

    def eos_id(self) -> int:
        return self._tokenizer.eos_id()

    def model(self) -> Any:
        """The engine's own nnx model (its weights are what `generate` samples with).

        Never the trainer's actor: tunix compares `model()` with the actor to decide whether
        the two share weights, and syncs only when they do not.
        """
        return self._engine.model_runner.model

    def shutdown(self) -> None:
        self._engine.shutdown()


def _per_row(completions: list[Any], field: str) -> list[np.ndarray]:
    return [np.asarray(getattr(c, field), np.float32) for c in completions]


def _routing(completions: list[Any], prompt_lengths: list[int]) -> dict[str, Any]:
    """`routed_experts` and `prompt_routed_experts` of `RolloutOutputWithEntropy` from each
    completion's per-input-position routing (`Completion.routed_experts`); empty without it."""
    if not completions or completions[0].routed_experts is None:
        return {}
    tokens, prompts = [], []
    for c, length in zip(completions, prompt_lengths, strict=True):
        routed = c.routed_experts
        expected = length + len(c.tokens) - 1
        if routed.shape[0] != expected:
            raise RuntimeError(
                f"the engine returned routed experts for {routed.shape[0]} positions, expected "
                f"{expected} (prompt {length} + completion {len(c.tokens)} - 1)"
            )
        last = np.full((1, *routed.shape[1:]), -1, np.int32)  # never an input
        tokens.append(np.concatenate([routed[length:], last]))
        prompts.append(routed[:length])
    return {"routed_experts": tokens, "prompt_routed_experts": prompts}


def _check_partial(partial_rollout: bool, max_staleness: int, settings: EngineSettings) -> None:
    if not isinstance(partial_rollout, bool):
        raise ValueError(f"partial_rollout must be True or False, got {partial_rollout!r}")
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"max_staleness must be an integer >= 0 (versions), got {max_staleness!r}")
    if partial_rollout and settings.return_routed_experts:
        raise ValueError(
            "partial_rollout cannot be combined with return_routed_experts: a continued "
            "sample's earlier routing would be recomputed under new weights"
        )


def _member(k: int, seeds: list[int], limits: list[int] | None) -> Member:
    """Sample `k` of a call's new groups: its seed and its own limit, where given."""
    return Member(seeds[k], limit=None if limits is None else limits[k])


def _check_partial_options(options: SamplingOptions) -> None:
    """Options a continued sample would change: they count its earlier tokens as prompt."""
    for name in ("frequency_penalty", "presence_penalty", "min_new_tokens"):
        if getattr(options, name):
            raise ValueError(
                f"{name}={getattr(options, name)} cannot be used with partial_rollout: a "
                "continued sample's earlier tokens become prompt tokens, which it does not count"
            )


def _settings(settings: EngineSettings | Mapping[str, Any] | None, mesh: Any) -> EngineSettings:
    if settings is None:
        settings = EngineSettings()
    elif not isinstance(settings, EngineSettings):
        settings = EngineSettings().replace(**dict(settings))
    if mesh is None:
        return settings
    devices = [int(d.id) for d in np.asarray(mesh.devices).reshape(-1)]
    return settings.replace(tp_size=len(devices), device_indexes=tuple(devices))
