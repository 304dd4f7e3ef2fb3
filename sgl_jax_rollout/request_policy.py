"""What a rollout call asks of the engine: the rollout's request policies, and the asking.

Owns `RequestPolicy`, built once per rollout from its engine, tokenizer, the model's EOS ids
and the rollout's default options:

- `call`: the options of one call (defaults, then `RolloutConfig`, then per-call overrides),
  checked against the vocabulary, and its length limits, checked against the context;
- `prompt_ids`: a prompt's ids with one BOS (`with_bos`, where the tokenizer has one; a
  session's first prompt gets it too), cut from the left to `max_prompt_length` with a warning;
- `refuse_pad`: a prompt that holds the pad id is refused by name (tunix would read the token
  as padding and score another sequence);
- `seeds`: one seed per sample (`rollout_inputs.sample_seeds`: an int gives every row its own
  stream, a list one seed per prompt, None fresh seeds from the rollout's generator; with one
  process per host, this process's rows are its share of the global batch's rows);
- `stop_rules`: the ids that end a completion (the model's EOS ids, `eos_tokens`, the options'
  `stop_token_ids` and the pad id, which tunix's trainer reads as padding) and the ids held back
  from the decoded text; `stop_rule`, the same stops (and the stop strings) as a partial
  rollout checks them again over a continued sample (`partial.StopRule`);
- `sample` / `sample_session`: the engine requests those rules give, for `generate` and for a
  managed session; a completion that sampled the pad id ends at it, as at a stop (`cut_at_pad`:
  tunix reads a pad as padding); a session's turn ends before it (its next prompt must not
  hold it).

The pure rules it composes live in `rollout_inputs`; `SglangJaxRollout` only translates.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.engine.hosts import process_share
from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.partial import StopRule
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.session import Sampled

logger = logging.getLogger(__name__)


class RequestPolicy:
    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        model_eos: list[int],
        defaults: SamplingOptions,
        seed: int,
    ) -> None:
        self.defaults = defaults
        self._engine = engine  # a RolloutEngine
        self._tokenizer = tokenizer  # a PadSafeTokenizer (tunix's TokenizerAdapter)
        self._model_eos = list(model_eos)
        self._vocab_size = engine.vocab_size
        self._context = engine.settings.context_length
        self._fresh_seeds = np.random.default_rng(seed)
        self._seeds_lock = threading.Lock()  # calls come from many threads at once
        self._logged = False

    def call(
        self, rollout_config: Any, overrides: Mapping[str, Any]
    ) -> tuple[SamplingOptions, int, int]:
        """Validated options of one call, its max new tokens and max prompt length."""
        options = inputs.options_for_call(self.defaults, rollout_config, dict(overrides))
        options.validate_for_vocab(self._vocab_size)
        max_new = rollout_config.max_tokens_to_generate
        max_prompt = rollout_config.max_prompt_length
        if not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"max_tokens_to_generate must be an integer >= 1, got {max_new!r}")
        if not isinstance(max_prompt, int) or max_prompt < 1:
            raise ValueError(f"max_prompt_length must be an integer >= 1, got {max_prompt!r}")
        if max_prompt + max_new > self._context:
            raise ValueError(
                f"max_prompt_length + max_tokens_to_generate ({max_prompt} + {max_new}) must "
                f"be <= the engine's context_length ({self._context})"
            )
        if not self._logged:
            logger.info("first rollout call samples with %s", options)
            self._logged = True
        return options, max_new, max_prompt

    def check_session_prompt(
        self, prompt_length: int, max_new: int, what: str = "the session prompt"
    ) -> None:
        """A session prompt (or `what`) is never truncated: one that leaves no room raises."""
        if prompt_length + max_new > self._context:
            raise ValueError(
                f"{what} has {prompt_length} tokens; with "
                f"max_tokens_to_generate={max_new} it exceeds the engine's context_length "
                f"({self._context})"
            )

    def with_bos(self, ids: Sequence[int]) -> list[int]:
        """`ids` starting with exactly one BOS, where the tokenizer has one (Gemma's and Llama's
        chat templates write it in the text; plain text has none)."""
        bos = inputs.bos_prefix(self._tokenizer.bos_id())
        return self._tokenizer.dedup_bos_ids(bos + list(ids))

    def prompt_ids(self, texts: Sequence[str], max_length: int) -> list[list[int]]:
        """Each prompt's ids (one BOS where the tokenizer has one), cut from the left to
        `max_length`: one warning per call names how many were cut and their lengths."""
        rows, cut = [], []
        for i, text in enumerate(texts):
            ids = self.with_bos(self._tokenizer.encode(str(text)))  # learners pass numpy str_
            kept, dropped = inputs.truncate_left(ids, max_length)
            if dropped:
                cut.append(f"{i} ({len(ids)})")
            rows.append(kept)
        if cut:
            listed = ", ".join(cut[:8]) + (f" and {len(cut) - 8} more" if len(cut) > 8 else "")
            logger.warning(
                "%d of %d prompts are longer than max_prompt_length=%d tokens and were cut "
                "from the left; prompt (tokens): %s",
                len(cut),
                len(rows),
                max_length,
                listed,
            )
        return rows

    def given_prompt_ids(self, rows: Any, max_new: int) -> list[list[int]]:
        """Prompts given as token ids (token in), used as given: no BOS added, never truncated
        (one that leaves no room for `max_new` tokens raises, as a session prompt does);
        ValueError naming the row where one is not a non-empty list of ids."""
        if not isinstance(rows, Sequence) or isinstance(rows, str) or not len(rows):
            raise ValueError("prompt_ids must be a non-empty list of token id lists")
        out = []
        for i, row in enumerate(rows):
            ids = np.asarray(row).tolist() if isinstance(row, np.ndarray) else row
            if isinstance(ids, str) or not isinstance(ids, Sequence) or not len(ids):
                raise ValueError(f"prompt_ids[{i}] must be a non-empty list of token ids")
            self.check_session_prompt(len(ids), max_new, f"prompt_ids[{i}]")
            out.append(list(ids))  # each id is checked against the vocabulary by the engine
        return out

    def refuse_pad(self, rows: list[list[int]]) -> None:
        pad = self._tokenizer.pad_id()
        for i, ids in enumerate(rows):
            if pad in ids:
                raise ValueError(
                    f"prompt {i} holds token id {pad}, the pad id the rollout hands tunix "
                    f"({self._tokenizer.pad_choice.why}); tunix's trainer would read it as "
                    "padding. Remove that token from the prompt or pass pad_id= to the rollout"
                )

    def seeds(self, seed: Any, num_prompts: int, n: int) -> list[int]:
        """One seed per sample; with several JAX processes, this process's share of the global
        batch's seeds (`hosts.process_share`)."""
        with self._seeds_lock:
            return inputs.sample_seeds(seed, num_prompts, n, self._fresh_seeds, process_share())

    def stop_rules(
        self, options: SamplingOptions, rollout_config: Any
    ) -> tuple[list[int], list[int]]:
        """(ids the engine stops at, ids held back from the decoded text)."""
        eos = inputs.eos_token_list(rollout_config.eos_tokens, self._vocab_size)
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
        return stop_ids, hold_back

    def stop_rule(self, options: SamplingOptions, rollout_config: Any) -> StopRule:
        """Where the engine ends a sample of this call: its stop ids (none with `ignore_eos`)
        and stop strings, matched as the engine matches them, with its tokenizer."""
        _, hold_back = self.stop_rules(options, rollout_config)
        if not options.stop:
            return StopRule(frozenset(hold_back))
        tokenizer = self._engine.tokenizer
        longest = max(len(tokenizer.encode(s, add_special_tokens=False)) for s in options.stop)
        return StopRule(frozenset(hold_back), tuple(options.stop), longest + 1, tokenizer.decode)

    def sample(
        self,
        rows: list[list[int]],
        seeds: list[int],
        options: SamplingOptions,
        rollout_config: Any,
        groups: list[int] | None = None,
        need_groups: int | None = None,
        limits: list[int] | None = None,
        keep_partial: bool = False,
        accept: Any = None,
    ) -> tuple[list[Any], list[int]]:
        """One completion per row (row r sampled with seeds[r]); also the held-back stop ids.
        With `groups` / `need_groups`, rows of the groups not needed are None, or with
        `keep_partial` what they had sampled (early stop: `RolloutEngine.generate`, whose
        `accept` judges each finished group). `limits`: each row's max new tokens (default:
        the config's)."""
        stop_ids, hold_back = self.stop_rules(options, rollout_config)
        single = options.replace(n=1)
        specs = [RequestSpec(single.replace(seed=s), stop_ids=tuple(hold_back)) for s in seeds]
        completions = self._engine.generate(
            rows,
            specs,
            max_new_tokens=limits or rollout_config.max_tokens_to_generate,
            stop=[options.stop] * len(rows),
            stop_token_ids=[stop_ids] * len(rows),
            ignore_eos=[options.ignore_eos] * len(rows),
            groups=groups,
            need_groups=need_groups,
            keep_partial=keep_partial,
            accept=accept,
        )
        pad = self._tokenizer.pad_id()
        return [c and inputs.cut_at_pad(c, pad) for c in completions], hold_back

    def sample_session(
        self, rollout_config: Any, prompt_ids: list[int], n: int, overrides: Mapping[str, Any]
    ) -> list[Sampled]:
        """A session's sampler (`session.Sampler`): `n` completions of one prompt, never
        truncated, with logprobs and entropy."""
        options, max_new, _ = self.call(rollout_config, {**overrides, "n": n})
        self.check_session_prompt(len(prompt_ids), max_new)
        self.refuse_pad([list(prompt_ids)])
        seeds = self.seeds(rollout_config.seed, 1, n)
        options = options.replace(return_logprobs=True, return_entropy=True)
        completions, _ = self.sample([prompt_ids] * n, seeds, options, rollout_config)
        # a turn that sampled the pad ends before it: the next turn's prompt must not hold it
        pad = self._tokenizer.pad_id()
        completions = [inputs.cut_at_pad(c, pad, keep=False) for c in completions]
        return [
            Sampled(c.tokens, c.logprobs, c.entropy, str(c.finish_reason), _sequence_routing(c))
            for c in completions
        ]


def _sequence_routing(completion: Any) -> np.ndarray | None:
    """A completion's routed experts over its whole sequence (prompt, then tokens), the last
    token's row -1 (never an input); None where the engine returns none."""
    routed = completion.routed_experts
    if routed is None:
        return None
    return np.concatenate([routed, np.full((1, *routed.shape[1:]), -1, np.int32)])
