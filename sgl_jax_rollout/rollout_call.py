"""One rollout call without partial rollouts: prompts in, a `RolloutOutputWithEntropy` out.

Owns `prepare`, what every call starts with (its options and limits, each sample's seed and
own limit, the prompts' ids, checked: `request_policy` holds the rules), and `sample_groups`,
the call itself for `generate` and for `generate_groups` without partial rollouts: `n` engine
rows per prompt (a group), with `groups_needed` the engine's early stop (the groups not needed
aborted, nothing of them returned) and with `accept` each finished group judged by its texts;
`generate_groups` names the groups by the caller's keys (`GroupsRequest`: what both kinds of
`generate_groups` call take).

Must not keep anything between calls: partial rollouts (`partial_call`) do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.request_policy import RequestPolicy
from sgl_jax_rollout.rollout_output import RolloutOutputWithEntropy, assemble, completion_text
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.tunix_compat import RolloutConfig


@dataclasses.dataclass(frozen=True)
class Call:
    """A call's inputs, checked: `limit` its max new tokens, `limits` each new sample's own
    (None where the caller gave none), `seeds` one per new sample (a prompt's `n` adjacent)."""

    options: SamplingOptions
    limit: int
    max_prompt: int
    prompt_ids: list[list[int]]
    seeds: list[int]
    limits: list[int] | None


def prepare(
    policy: RequestPolicy,
    prompts: list[str] | None,
    rollout_config: RolloutConfig,
    overrides: dict[str, Any],
    max_tokens_per_sample: Sequence[int] | None,
    check: Callable[[SamplingOptions], None] | None = None,
    given_ids: list[list[int]] | None = None,
) -> Call:
    """`prompts`' call under `rollout_config` and the per-call `overrides`, or with `given_ids`
    (token in) the call of those prompt ids, used as given (`RequestPolicy.given_prompt_ids`;
    the padded prompt width grows to the longest); `check` refuses options the caller cannot
    serve, before anything else is read."""
    options, limit, max_prompt = policy.call(rollout_config, overrides)
    if check is not None:
        check(options)
    if given_ids is None:
        ids = policy.prompt_ids(prompts, max_prompt)
    else:
        ids = policy.given_prompt_ids(given_ids, limit)
        max_prompt = max(max_prompt, *map(len, ids))
    limits = inputs.sample_limits(max_tokens_per_sample, len(ids) * options.n, limit)
    seeds = policy.seeds(rollout_config.seed, len(ids), options.n)
    policy.refuse_pad(ids)
    return Call(options, limit, max_prompt, ids, seeds, limits)


def sample_groups(
    policy: RequestPolicy,
    tokenizer: Any,
    prompts: list[str],
    rollout_config: RolloutConfig,
    groups_needed: int | None,
    overrides: dict[str, Any],
    max_tokens_per_sample: Sequence[int] | None = None,
    accept: Callable[[int, list[str]], bool] | None = None,
    given_ids: list[list[int]] | None = None,
) -> tuple[RolloutOutputWithEntropy, list[int]]:
    """The output of every kept group's samples (all of them without `groups_needed`), and the
    kept groups' prompt indices, in prompt order. `accept(index, texts)` judges a finished
    group (`tokenizer` decodes its texts). With `given_ids`, `prompts` is None: the prompts
    are those ids (`prepare`)."""
    texts = None if given_ids is not None else inputs.prompt_list(prompts)
    call = prepare(
        policy, texts, rollout_config, overrides, max_tokens_per_sample, given_ids=given_ids
    )
    n = call.options.n
    rows = [ids for ids in call.prompt_ids for _ in range(n)]
    groups = None if groups_needed is None else [i // n for i in range(len(rows))]
    judge = None
    if accept is not None:
        held = set(policy.stop_rules(call.options, rollout_config)[1])
        pad = tokenizer.pad_id()

        def judge(group: int, done: list[Any]) -> bool:
            # the texts as trained: a completion that sampled the pad ends there, as
            # `RequestPolicy.sample` cuts what it returns
            done = [inputs.cut_at_pad(c, pad) for c in done]
            trimmed = call.options.trimmed_stops
            return accept(
                group, [completion_text(tokenizer, c.tokens, held, trimmed) for c in done]
            )

    completions, hold_back = policy.sample(
        rows,
        call.seeds,
        call.options,
        rollout_config,
        groups,
        groups_needed,
        limits=call.limits,
        accept=judge,
    )
    kept = sorted({i // n for i, c in enumerate(completions) if c is not None})
    rows = [r for r, c in zip(rows, completions, strict=True) if c is not None]
    completions = [c for c in completions if c is not None]
    output = assemble(completions, rows, call.max_prompt, call.options, tokenizer, set(hold_back))
    return output, kept


@dataclasses.dataclass
class GroupsRequest:
    """A `generate_groups` call's arguments (`SglangJaxRollout.generate_groups` says what each
    means): `keys[i]` names `prompts[i]`; `overrides` are the per-call `SamplingOptions`."""

    prompts: list[str]
    rollout_config: RolloutConfig
    groups_needed: int
    keys: list[Any] | None
    max_tokens_per_sample: Sequence[int] | None
    overrides: dict[str, Any]
    accept: Callable[[Any, list[str]], bool] | None

    def __post_init__(self) -> None:
        """Keys default to the prompts' indexes; a wrong count raises before the engine."""
        given = self.keys
        self.keys = list(range(len(self.prompts))) if given is None else list(given)
        if len(self.keys) != len(self.prompts):
            raise ValueError(f"keys has {len(self.keys)} entries for {len(self.prompts)} prompts")


def generate_groups(
    policy: RequestPolicy, tokenizer: Any, request: GroupsRequest
) -> tuple[RolloutOutputWithEntropy, list[Any]]:
    """`sample_groups` with early stop, its groups named by the request's keys: `accept` is
    asked with a group's key, and the kept groups come back as their keys."""
    keys, accept = request.keys, request.accept
    by_index = None if accept is None else (lambda i, texts: accept(keys[i], texts))
    output, kept = sample_groups(
        policy,
        tokenizer,
        request.prompts,
        request.rollout_config,
        request.groups_needed,
        request.overrides,
        request.max_tokens_per_sample,
        by_index,
    )
    return output, [keys[i] for i in kept]
