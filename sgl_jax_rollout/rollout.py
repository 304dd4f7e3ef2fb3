"""`SglangJaxRollout`: tunix's `BaseRollout` on the in-process sgl-jax engine.

A thin adapter, like tunix's `VanillaRollout`: it turns prompts and `RolloutConfig` into
engine requests (`rollout_inputs` holds the rules) and engine completions into a
`RolloutOutput` with `entropy` added, aligned as docs/design.md section 4 says. Engine mechanics
live in `sgl_jax_rollout.engine`, sampling math in `sgl_jax_rollout.sampling`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.engine.lora import lora_names
from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.engine.settings import EngineSettings
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.tunix_compat import (
    BaseRollout,
    RolloutConfig,
    RolloutOutput,
    TokenizerAdapter,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RolloutOutputWithEntropy(RolloutOutput):
    """tunix's `RolloutOutput` plus the per-token entropy of each sample (None if not asked)."""

    entropy: list[np.ndarray] | None = None


class SglangJaxRollout(BaseRollout):
    """Rollout worker on sgl-jax with our sampler: tokens, logprobs and entropy per token.

    Built by tunix's cluster as `rollout_engine(rollout_actor=, tokenizer=, mesh=,
    rollout_config=)` (pass our own options through `functools.partial`):
    - model_path: HF-style model directory (default: the built-in tiny model);
    - engine_settings: `EngineSettings` or a dict of its fields;
    - sampling: `SamplingOptions` or a dict; defaults for fields `RolloutConfig` lacks
      (repetition / frequency / presence penalty, min_p, entropy settings...);
    - use_generation_config: take those defaults from the model's generation_config.json
      (penalties, min_p) before `sampling` (off by default: a checkpoint's sampling defaults
      would make every rollout off-policy). `RolloutConfig`'s temperature / top_p / top_k
      always win;
    - sync_actor_weights: load `rollout_actor`'s weights into the engine at start, so the
      engine serves exactly the trainer's parameters;
    - lora_scaling: qwix's `alpha / rank`, for an actor with LoRA adapters (default: the
      rollout config's `rollout_sglang_jax_lora_scaling`). The engine then serves the merged
      `W + lora_scaling * A @ B`; `update_params(lora_state, (nnx.LoRAParam,))`, which is what
      tunix's `sync_weights` sends, merges the new adapters into the actor's frozen base.
    With a `mesh`, the engine uses its devices (`tp_size` = device count).
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
    ) -> None:
        from sgl_jax_rollout.engine.engine import RolloutEngine
        from sgl_jax_rollout.tiny_model import default_model_dir

        model_path = Path(model_path) if model_path is not None else default_model_dir()
        settings = _settings(engine_settings, mesh)
        defaults = inputs.rollout_defaults(model_path, use_generation_config)
        if isinstance(sampling, SamplingOptions):
            defaults = sampling
        elif sampling is not None:
            defaults = defaults.replace(**dict(sampling))
        self._defaults = defaults
        self._logged_options = False
        self._rollout_config = rollout_config
        self._fresh_seeds = np.random.default_rng(seed)
        if lora_scaling is None:
            lora_scaling = getattr(rollout_config, "rollout_sglang_jax_lora_scaling", None)
        self._lora_scaling = lora_scaling
        self._model_path = model_path
        self._actor = rollout_actor
        self._engine = RolloutEngine(model_path, settings, inputs.sampler_modes(defaults))
        try:  # a failure from here on must not leave the engine running
            self._tokenizer = TokenizerAdapter(tokenizer or self._engine.tokenizer)
            self._model_eos = inputs.eos_ids(model_path, self._tokenizer.eos_id())
            if rollout_actor is not None and sync_actor_weights:
                from flax import nnx

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
        self,
        prompts: list[str],
        rollout_config: RolloutConfig,
        **kwargs: Any,
    ) -> RolloutOutputWithEntropy:
        """Samples completions; `kwargs` override any `SamplingOptions` field for this call."""
        if isinstance(prompts, np.ndarray) and prompts.ndim == 1:
            prompts = prompts.tolist()  # tunix's PPO learner passes its numpy batch as is
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise ValueError(f"prompts must be a list of strings, got {type(prompts).__name__}")
        if not prompts:
            raise ValueError("prompts must not be empty")
        bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
        if bad:
            raise ValueError(f"prompts must be strings; not at index(es) {bad[:10]}")
        options, max_new, max_prompt = self._call_options(rollout_config, kwargs)
        n = options.n
        seeds = inputs.sample_seeds(rollout_config.seed, len(prompts), n, self._fresh_seeds)
        prompt_ids = [self._prompt_ids(p, max_prompt, i) for i, p in enumerate(prompts)]
        rows = [ids for ids in prompt_ids for _ in range(n)]
        completions, hold_back = self._sample_rows(rows, seeds, options, rollout_config)
        tokens = [np.asarray(c.tokens, np.int32) for c in completions]
        stops = set(hold_back)
        return RolloutOutputWithEntropy(
            text=[
                self._tokenizer.decode([t for t in c.tokens if t not in stops]) for c in completions
            ],
            logits=None,
            tokens=tokens,
            left_padded_prompt_tokens=inputs.left_pad(rows, max_prompt, self.pad_id()),
            logprobs=(
                [np.asarray(c.logprobs, np.float32) for c in completions]
                if options.return_logprobs
                else None
            ),
            entropy=(
                [np.asarray(c.entropy, np.float32) for c in completions]
                if options.return_entropy
                else None
            ),
        )

    def session(
        self,
        track_tree: bool = False,
        rollout_config: RolloutConfig | None = None,
        strict: bool = False,
    ):
        """A managed multi-turn session (`sgl_jax_rollout.session`) on this rollout.

        Use as `with rollout.session() as s:`; `s.complete(text or ids, n=, **overrides)`,
        `s.chat(messages, n=, **overrides)`, `s.chat_extend(node, new_messages, ...)`,
        `s.state()`, `s.trajectories()`. Sampling uses `rollout_config` (default: the
        constructor's) and per-call `SamplingOptions` overrides; prompts are never truncated (a
        too long one raises). `strict=True`: a prompt that extends no node raises (else warns).
        """
        from sgl_jax_rollout.session import Sampled, Session

        config = rollout_config or self._rollout_config or RolloutConfig()

        def sample(prompt_ids: list[int], n: int, overrides: dict[str, Any]) -> list[Sampled]:
            options, max_new, _ = self._call_options(config, {**overrides, "n": n})
            context = self._engine.settings.context_length
            if len(prompt_ids) + max_new > context:
                raise ValueError(
                    f"the session prompt has {len(prompt_ids)} tokens; with "
                    f"max_tokens_to_generate={max_new} it exceeds the engine's context_length "
                    f"({context})"
                )
            seeds = inputs.sample_seeds(config.seed, 1, n, self._fresh_seeds)
            options = options.replace(return_logprobs=True, return_entropy=True)
            completions, _ = self._sample_rows([prompt_ids] * n, seeds, options, config)
            return [
                Sampled(c.tokens, c.logprobs, c.entropy, str(c.finish_reason)) for c in completions
            ]

        return Session(
            sample,
            self._engine.tokenizer,
            track_tree=track_tree,
            strict=strict,
            vocab_size=self._engine.vocab_size,
        )

    def _call_options(
        self, rollout_config: RolloutConfig, kwargs: Mapping[str, Any]
    ) -> tuple[SamplingOptions, int, int]:
        """Validated options of one call, its max new tokens and max prompt length."""
        options = inputs.options_for_call(self._defaults, rollout_config, dict(kwargs))
        options.validate_for_vocab(self._engine.vocab_size)
        max_new = rollout_config.max_tokens_to_generate
        max_prompt = rollout_config.max_prompt_length
        if not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"max_tokens_to_generate must be an integer >= 1, got {max_new!r}")
        if not isinstance(max_prompt, int) or max_prompt < 1:
            raise ValueError(f"max_prompt_length must be an integer >= 1, got {max_prompt!r}")
        context = self._engine.settings.context_length
        if max_prompt + max_new > context:
            raise ValueError(
                f"max_prompt_length + max_tokens_to_generate ({max_prompt} + {max_new}) must "
                f"be <= the engine's context_length ({context})"
            )
        if not self._logged_options:
            logger.info("first rollout call samples with %s", options)
            self._logged_options = True
        return options, max_new, max_prompt

    def _sample_rows(
        self,
        rows: list[list[int]],
        seeds: list[int],
        options: SamplingOptions,
        rollout_config: RolloutConfig,
    ) -> tuple[list[Any], list[int]]:
        """One completion per row (row r sampled with seeds[r]); also the held-back stop ids."""
        eos = inputs.eos_token_list(rollout_config.eos_tokens, self._engine.vocab_size)
        if options.ignore_eos and (eos or options.stop_token_ids):
            raise ValueError(
                "ignore_eos=True cannot be combined with stop_token_ids or eos_tokens: the "
                "pinned sgl-jax ignores every stop id when ignore_eos is set"
            )
        # eos_tokens stop generation in addition to the model's EOS ids. So does the pad id:
        # tunix's trainer reads every pad as padding, so no token may follow a sampled pad.
        stop_ids = list(options.stop_token_ids) + eos
        pad = self._tokenizer.pad_id()
        if not options.ignore_eos and pad is not None and pad not in stop_ids + self._model_eos:
            stop_ids.append(int(pad))
        hold_back = [] if options.ignore_eos else stop_ids + self._model_eos
        single = options.replace(n=1)
        specs = [
            RequestSpec(single.replace(seed=seed), stop_ids=tuple(hold_back)) for seed in seeds
        ]
        completions = self._engine.generate(
            rows,
            specs,
            max_new_tokens=rollout_config.max_tokens_to_generate,
            stop=[options.stop] * len(rows),
            stop_token_ids=[stop_ids] * len(rows),
            ignore_eos=[options.ignore_eos] * len(rows),
        )
        return completions, hold_back

    def _prompt_ids(self, text: str, max_length: int, index: int) -> list[int]:
        ids = self._tokenizer.encode(str(text))  # tunix's learners pass numpy str_ items
        bos = inputs.bos_prefix(self._tokenizer.bos_id())
        ids = self._tokenizer.dedup_bos_ids(bos + list(ids))
        ids, dropped = inputs.truncate_left(ids, max_length)
        if dropped:
            logger.warning(
                "prompt %d has %d tokens; dropped the first %d (max_prompt_length=%d)",
                index,
                len(ids) + dropped,
                dropped,
                max_length,
            )
        return ids

    def get_per_token_logps(
        self,
        prompt_tokens: Int[Array, "batch prompt_len"],
        completion_tokens: Int[Array, "batch completion_len"],
    ) -> Float[Array, "batch completion_len"]:
        """Logprobs of the completion tokens under the engine's current weights (prefill only).

        Prompts are left-padded, completions right-padded with `pad_id`; a completion ends at
        its first EOS (kept). Positions past the end are 0.
        """
        prompt_tokens = np.asarray(prompt_tokens)
        completion_tokens = np.asarray(completion_tokens)
        if prompt_tokens.ndim != 2 or completion_tokens.ndim != 2:
            raise ValueError("prompt_tokens and completion_tokens must be 2-D [batch, length]")
        if prompt_tokens.shape[0] != completion_tokens.shape[0]:
            raise ValueError(
                f"batch sizes differ: {prompt_tokens.shape[0]} prompts, "
                f"{completion_tokens.shape[0]} completions"
            )
        prompts = inputs.prompt_rows(prompt_tokens, self.pad_id())
        completions = inputs.completion_rows(completion_tokens, self.pad_id(), self.eos_id())
        scores = self._engine.score(prompts, completions)
        return jnp.asarray(inputs.right_pad_values(scores, completion_tokens.shape[1]))

    def update_params(self, params: Any, filter_types: tuple[Any, ...] | None = None) -> None:
        """Swaps in new weights (tunix nnx state or engine layout); see `engine.weights`.

        LoRA factors (tunix passes only `nnx.LoRAParam` when the actor has adapters; a full
        `nnx.Param` state of a LoRA model holds base and factors) are merged into the actor's
        frozen base weights on the way in (`engine.lora`).
        """
        del filter_types  # the cluster already filtered the state it passes; names tell LoRA
        from flax import nnx

        if not isinstance(params, nnx.State) or not lora_names(params):
            self._engine.update_weights(params)
            return
        if self._lora_scaling is None:
            raise ValueError(
                "update_params: LoRA factors need lora_scaling (qwix's alpha / rank): pass "
                "SglangJaxRollout(lora_scaling=...)"
            )
        lora = params.filter(nnx.LoRAParam)
        base = params.filter(nnx.Not(nnx.LoRAParam))
        if not jax.tree_util.tree_leaves(base):  # only adapters: the base is the actor's
            if self._actor is None:
                raise ValueError(
                    "update_params: an adapters-only update needs the base weights: build the "
                    "rollout with rollout_actor= (the LoRA model), as tunix's cluster does"
                )
            base = nnx.state(self._actor, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
        self._engine.update_weights(base, lora=lora, lora_scaling=self._lora_scaling)

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
