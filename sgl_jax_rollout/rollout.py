"""`SglangJaxRollout`: tunix's `BaseRollout` on the in-process sgl-jax engine.

A thin adapter, like tunix's `VanillaRollout`: it turns prompts and `RolloutConfig` into
engine requests (`rollout_inputs` holds the rules) and engine completions into a
`RolloutOutput` with `entropy` added, aligned as docs/design.md section 4 says. A call's
orchestration lives in `rollout_call` (`generate`, over-sampling with early stop and `accept`)
and `partial_call` (partial rollouts), the output's layout in `rollout_output`; engine mechanics
in `sgl_jax_rollout.engine`, sampling math in `sgl_jax_rollout.sampling`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from sgl_jax_rollout import partial_call, rollout_call
from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.engine.lora import lora_layout, split_update
from sgl_jax_rollout.engine.settings import EngineSettings
from sgl_jax_rollout.pad_id import pad_safe
from sgl_jax_rollout.partial import PausedGroups
from sgl_jax_rollout.request_policy import RequestPolicy
from sgl_jax_rollout.rollout_memory import RolloutMemory
from sgl_jax_rollout.rollout_output import RolloutOutputWithEntropy
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.tunix_compat import BaseRollout, RolloutConfig, TokenizerAdapter


class SglangJaxRollout(RolloutMemory, BaseRollout):
    """Rollout worker on sgl-jax with our sampler: tokens, logprobs and entropy per token.

    Built by tunix's cluster as `rollout_engine(rollout_actor=, tokenizer=, mesh=,
    rollout_config=)`; our own options (`model_path`, `engine_settings`, `sampling`,
    `use_generation_config`, `sync_actor_weights`, `lora_scaling`, `seed`, `pad_id`,
    `partial_rollout`, `max_staleness`) come through `functools.partial`: docs/guide.md, "The
    rollout", says each with its default. `RolloutConfig`'s temperature / top_p / top_k always
    win. This class translates tunix's vocabulary and nothing else: policies (BOS, stop and
    pad ids, seeds, limits) live in `request_policy`, a call's orchestration in `rollout_call`
    and `partial_call`.
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
        partial_call.check_partial(partial_rollout, max_staleness, settings)
        self._partial_rollout, self._max_staleness = partial_rollout, max_staleness
        self._paused = PausedGroups()
        self._partial_calls = threading.Lock()  # partial calls share the paused groups
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
        return rollout_call.sample_groups(
            self._policy, self._tokenizer, prompts, rollout_config, None, kwargs
        )[0]

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], rollout_config: RolloutConfig, **kwargs: Any
    ) -> RolloutOutputWithEntropy:
        """`generate` from prompts given as token ids (token in, token out: a multi-turn
        episode's next prompt is its last prompt, the tokens sampled and the environment's
        tokens, never its text encoded again). The ids are used as given: no BOS added, never
        truncated (a prompt that leaves no room for `max_tokens_to_generate` in the engine's
        context raises), the pad id refused; `left_padded_prompt_tokens` is as wide as the
        longest prompt where that passes `max_prompt_length`."""
        return rollout_call.sample_groups(
            self._policy, self._tokenizer, None, rollout_config, None, kwargs, given_ids=prompt_ids
        )[0]

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
        asked as groups finish while the engine goes on; a refused group is dropped, and a
        call whose groups are refused returns fewer than `groups_needed` (slime sends more
        prompts then: so does `GroupSampler`; the texts judged are those returned, cut after a
        sampled pad id). slime's
        `--over-sampling-batch-size` is `len(prompts)`, its `--rollout-batch-size`
        `groups_needed`. Returns the kept groups' output (prompt order, a group's samples
        adjacent, as `generate` lays them out) and the kept groups' keys: `keys[i]` names
        `prompts[i]` (default: its index). With partial rollouts a kept group may come from an
        earlier call, under the key that call gave it: give keys that tell calls apart; and
        `prompts` may be empty while groups are paused (the call continues those alone).
        `max_tokens_per_sample`: each new sample's own max new tokens (`len(prompts) * n`
        integers in [1, `max_tokens_to_generate`], a group's samples adjacent); a paused
        sample keeps its own across calls, capped by each call's limit. Early stop favours the
        groups that finish first, so short completions (docs/guide.md, "Groups")."""
        request = rollout_call.GroupsRequest(
            prompts, rollout_config, groups_needed, keys, max_tokens_per_sample, kwargs, accept
        )
        if not self._partial_rollout:
            return rollout_call.generate_groups(self._policy, self._tokenizer, request)
        with self._partial_calls:  # one at a time: each continues what the last one paused
            state = (self._paused, self.policy_version, self._max_staleness)
            return partial_call.generate_groups(self._policy, self._tokenizer, *state, request)

    @property
    def policy_version(self) -> int:
        """The weight version the engine serves: + 1 at every `update_params`. Every output
        says which version sampled each token (`versions`): an update waits for the calls
        running when it arrives, and calls arriving meanwhile wait for it, so a completion
        never mixes two (but a partial rollout's continued samples, by design)."""
        return self._engine.weights_version

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

    def prompt_token_ids(self, prompts: list[str], max_prompt_length: int) -> list[list[int]]:
        """The ids `generate` sends for each prompt: one BOS where the tokenizer has one, cut
        from the left to `max_prompt_length` (with a warning)."""
        return self._policy.prompt_ids(prompts, max_prompt_length)

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


def _settings(settings: EngineSettings | Mapping[str, Any] | None, mesh: Any) -> EngineSettings:
    if settings is None:
        settings = EngineSettings()
    elif not isinstance(settings, EngineSettings):
        settings = EngineSettings().replace(**dict(settings))
    if mesh is None:
        return settings
    devices = [int(d.id) for d in np.asarray(mesh.devices).reshape(-1)]
    return settings.replace(tp_size=len(devices), device_indexes=tuple(devices))
