"""A `generate_groups` call with partial rollouts (slime `--partial-rollout`), and its checks.

Owns the call, in order: the paused groups resumed first (oldest first, less those older than
`max_staleness` versions), the new prompts' groups after them; with `accept`, the groups
already complete judged at once (`_Verdicts`); the engine asked to continue every unfinished
sample until enough groups are complete (early stop, keeping what the aborted samples had
sampled; never more groups than are unfinished, so a call whose groups `accept` refused
returns fewer than it was asked for, as slime's rounds do), with `accept` judging each group
as it finishes; then the kept groups assembled and the groups not needed paused again (those
`accept` refused are dropped, those complete but not judged yet paused, to be judged first
next call). A call that fails pauses its resumed groups again, less those refused. Also the
refusals partial rollouts put on the rollout's options (`check_partial`) and on a call's
options (`check_partial_options`).

Must not keep state: the paused groups and the policy version are the rollout's, passed in at
each call; the bookkeeping (`Member`, `Group`, `PausedGroups`, `StopRule`) is `partial`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.engine.settings import EngineSettings
from sgl_jax_rollout.partial import Group, Member, PausedGroups, StopRule
from sgl_jax_rollout.request_policy import RequestPolicy
from sgl_jax_rollout.rollout_call import Call, GroupsRequest, prepare
from sgl_jax_rollout.rollout_output import RolloutOutputWithEntropy, assemble, completion_text
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.tunix_compat import RolloutConfig


def generate_groups(
    policy: RequestPolicy,
    tokenizer: Any,
    paused: PausedGroups,
    version: int,
    max_staleness: int,
    request: GroupsRequest,
) -> tuple[RolloutOutputWithEntropy, list[Any]]:
    """`generate_groups` with partial rollouts: the paused groups (continued first) and
    the new prompts' groups. With `accept`, the groups it refuses are dropped, and those
    complete but not yet judged when enough passed are paused, to be judged first next.
    `version` is the policy version now."""
    rollout_config, groups_needed, prompts = request.rollout_config, request.groups_needed, []
    # no new prompt is fine while paused groups remain: they are the call's groups
    if len(request.prompts) or not len(paused):
        prompts = inputs.prompt_list(request.prompts)
    call = prepare(
        policy,
        prompts,
        rollout_config,
        request.overrides,
        request.max_tokens_per_sample,
        check_partial_options,
    )
    total = len(paused) + len(call.prompt_ids)
    if not 1 <= groups_needed <= total:
        raise ValueError(
            f"groups_needed must be in [1, {total}] (prompts and paused groups), got "
            f"{groups_needed}"
        )
    resumed = paused.resume(version, max_staleness)
    groups = resumed + _new_groups(call, request.keys)
    if len(groups) < groups_needed:
        paused.pause(resumed)
        raise ValueError(
            f"groups_needed is {groups_needed}, but after dropping paused groups older than "
            f"max_staleness={max_staleness} versions only {len(groups)} remain"
        )
    for member in (m for g in groups for m in g.members):
        member.done = member.done or len(member.tokens) >= member.budget(call.limit)
    stop_rule = policy.stop_rule(call.options, rollout_config)
    held = set(stop_rule.ids)  # the held-back stop ids (none with ignore_eos)
    verdicts = None
    if request.accept is not None:
        verdicts = _Verdicts(request.accept, tokenizer, held, call.options.trimmed_stops)
    try:
        if verdicts is not None:  # the paused groups that finished unjudged, judged first
            for group in (g for g in groups if g.complete):
                verdicts(group, [m.tokens for m in group.members])
        refused = set() if verdicts is None else verdicts.refused
        ready = sum(g.complete and g not in refused for g in groups)
        # a round takes what it can: refused groups may leave fewer to finish than it needs
        unfinished = sum(not g.complete for g in groups)
        if ready < groups_needed and unfinished:
            running = [(g, m) for g in groups if not g.complete for m in g.members if not m.done]
            need = min(groups_needed - ready, unfinished)
            pad = tokenizer.pad_id()
            completions = _continue(
                policy, running, call, rollout_config, stop_rule, need, verdicts, pad
            )
            for (_, member), done in zip(running, completions, strict=True):
                member.extend(done, done.weights_version, call.limit, stop_rule)
    except BaseException:
        # nothing paused is lost when a call fails; a group `accept` refused stays dropped
        refused = set() if verdicts is None else verdicts.refused
        paused.pause([g for g in resumed if g not in refused])
        raise
    complete = [g for g in groups if g.complete] if verdicts is None else verdicts.accepted
    kept = complete[:groups_needed]
    paused.pause([g for g in groups if g not in kept and g not in refused])
    members = [m for g in kept for m in g.members]
    rows = [g.prompt for g in kept for _ in g.members]
    output = assemble(members, rows, call.max_prompt, call.options, tokenizer, held, versions=True)
    return output, [g.key for g in kept]


class _Verdicts:
    """`accept`'s verdicts in one call, asked with a group's key and texts (`stops` left out):
    the groups it passed, in the order it did (the call keeps the first it needs), and those it
    refused."""

    def __init__(
        self,
        accept: Callable[[Any, list[str]], bool],
        tokenizer: Any,
        stops: set[int],
        trimmed: tuple[str, ...],
    ) -> None:
        self._accept, self._tokenizer, self._stops = accept, tokenizer, stops
        self._trimmed = trimmed
        self.accepted: list[Group] = []
        self.refused: set[Group] = set()

    def __call__(self, group: Group, tokens: list[list[int]]) -> bool:
        texts = [completion_text(self._tokenizer, t, self._stops, self._trimmed) for t in tokens]
        ok = bool(self._accept(group.key, texts))
        if ok:
            self.accepted.append(group)
        else:
            self.refused.add(group)
        return ok


def _new_groups(call: Call, keys: list[Any]) -> list[Group]:
    """A group per new prompt, under its key; sample `k` of the call with its seed and its own
    limit, where given."""
    n = call.options.n

    def member(k: int) -> Member:
        return Member(call.seeds[k], limit=None if call.limits is None else call.limits[k])

    return [
        Group(keys[i], ids, [member(i * n + j) for j in range(n)])
        for i, ids in enumerate(call.prompt_ids)
    ]


def _continue(
    policy: RequestPolicy,
    running: list[tuple[Group, Member]],
    call: Call,
    rollout_config: RolloutConfig,
    stop_rule: StopRule,
    need_groups: int,
    verdicts: _Verdicts | None,
    pad: int,
) -> list[Any]:
    """The engine's completion of each `running` sample (a group's adjacent), continued from
    its tokens so far until `need_groups` more groups are complete; the others aborted, with
    what they sampled. `verdicts` judges each group as it finishes, by the tokens the
    completions would leave it with (cut after a sampled `pad`, as `RequestPolicy.sample`
    cuts what it returns)."""
    asks = [m.request(g.prompt, call.limit) for g, m in running]
    ids = {g: k for k, g in enumerate(dict.fromkeys(g for g, _ in running))}
    order = list(ids)

    def judge(index: int, done: list[Any]) -> bool:
        group = order[index]
        # judged as trained: a completion that sampled the pad ends there (`sample` cuts it)
        done = [inputs.cut_at_pad(c, pad) for c in done]
        new = dict(zip([m for g, m in running if g is group], done, strict=True))
        tokens = [m.preview(new[m], stop_rule) if m in new else m.tokens for m in group.members]
        return verdicts(group, tokens)

    completions, _ = policy.sample(
        [ask[0] for ask in asks],
        [ask[2] for ask in asks],
        call.options,
        rollout_config,
        groups=[ids[g] for g, _ in running],
        need_groups=need_groups,
        limits=[ask[1] for ask in asks],
        keep_partial=True,
        accept=None if verdicts is None else judge,
    )
    return completions


def check_partial(partial_rollout: bool, max_staleness: int, settings: EngineSettings) -> None:
    """The rollout's options: `partial_rollout` a bool, `max_staleness` versions, no routing."""
    if not isinstance(partial_rollout, bool):
        raise ValueError(f"partial_rollout must be True or False, got {partial_rollout!r}")
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"max_staleness must be an integer >= 0 (versions), got {max_staleness!r}")
    if partial_rollout and settings.return_routed_experts:
        raise ValueError(
            "partial_rollout cannot be combined with return_routed_experts: a continued "
            "sample's earlier routing would be recomputed under new weights"
        )


def check_partial_options(options: SamplingOptions) -> None:
    """Options a continued sample would change: they count its earlier tokens as prompt."""
    for name in ("frequency_penalty", "presence_penalty", "min_new_tokens"):
        if getattr(options, name):
            raise ValueError(
                f"{name}={getattr(options, name)} cannot be used with partial_rollout: a "
                "continued sample's earlier tokens become prompt tokens, which it does not count"
            )
