"""Groups on the real engine: a group's prompt prefilled once (`share_group_prefill`),
over-sampling with early stop (`generate_groups`, `RolloutEngine.generate(need_groups=)`) and
partial rollouts (`partial_rollout`)."""

from __future__ import annotations

import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.partial import PausedGroups
from sgl_jax_rollout.sampling.options import SamplingOptions
from tests.conftest import after_asyncio_run
from tests.conftest import perturbed as perturbed_state
from tests.sgl_jax_rollout.test_rollout import comparable, config, padded, trainer_logps

pytestmark = pytest.mark.engine


def flush(rollout) -> None:
    """Empties the prefix cache, the weights and their version kept."""
    version = rollout.policy_version
    rollout.engine.flush_prefix_cache()
    assert rollout.policy_version == version


def pool_state(engine) -> dict[str, int]:
    """The KV pool as the idle scheduler sees it: slots free, cached (evictable), held."""

    def read(scheduler):
        cache = scheduler.tree_cache
        return {
            "free": scheduler.token_to_kv_pool_allocator.available_size(),
            "cached": cache.evictable_size(),
            "held": cache.protected_size(),
            "size": scheduler.token_to_kv_pool_allocator.size_per_rank,
            "running": sum(len(i.reqs or ()) for i in scheduler.running_batch.reqs_info),
            "waiting": len(scheduler.waiting_queue),
        }

    return engine._when_idle(read)


def test_a_groups_prompt_is_prefilled_once_and_the_samples_do_not_change(
    rollout, trainer, monkeypatch
):
    """4 prompts x n = 4 in one prefill batch: with sharing, the engine's counters say each
    prompt was computed once plus, per sample, what upstream's prefix match leaves to compute
    (the last prompt token at page size 1; past the last whole page before it at larger
    pages, which the prefix cache keeps whole); without, every copy computes its whole prompt.
    Same seeds give the same tokens, and the logprobs still equal the trainer's."""
    engine = rollout.engine
    page = engine.settings.page_size
    prompts = [f"{i}: the quick brown fox jumps over the lazy dog {i} " * 4 for i in range(4)]
    cfg = config(max_tokens_to_generate=8, max_prompt_length=128)
    lengths = list(map(len, rollout.prompt_token_ids(prompts, 128)))
    unique = sum(lengths)
    left = sum(n - (n - 1) // page * page for n in lengths)  # per sample, after its prefix hit
    outs, computed = {}, {}
    for share in (False, True):
        monkeypatch.setattr(engine, "settings", engine.settings.replace(share_group_prefill=share))
        flush(rollout)
        before = engine.prefill_counts.computed
        outs[share] = rollout.generate(prompts, cfg, n=4)
        computed[share] = engine.prefill_counts.computed - before
    rows = len(outs[True].tokens)
    assert rows == 16 and min(lengths) > 64  # a whole page of each prompt is shared at 64
    assert computed[True] == unique + 4 * left, computed
    assert computed[False] == 4 * unique, computed
    for a, b in zip(outs[False].tokens, outs[True].tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(outs[False].logprobs, outs[True].logprobs, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    out = outs[True]
    prompt_tokens, completions = padded(out, rollout, 8)
    (ref,) = trainer_logps(trainer, rollout, prompt_tokens, completions)
    for i, lp in enumerate(out.logprobs):
        k = comparable(out.tokens[i], rollout.pad_id())
        np.testing.assert_allclose(lp[:k], np.asarray(ref[i, :k]), atol=1e-4)


def test_more_repeated_prompts_than_running_requests_are_prefilled_in_turns(rollout):
    """More groups than `max_running_requests` (16 here): upstream keeps a prefill-only batch
    out of its running batch, so sending every shared prefill at once overran the request
    slots (`alloc_req_slots runs out of memory`, the engine stopped). Each prompt is still
    computed at most once (less where a later turn's prompts share a prefix the first cached)."""
    engine = rollout.engine
    assert engine.settings.max_running_requests == 16
    prompts = [f"prompt {i} of a call with many groups" for i in range(20)]
    flush(rollout)
    before = engine.prefill_counts.computed
    out = rollout.generate(prompts, config(max_tokens_to_generate=2, max_prompt_length=32), n=2)
    unique = sum(map(len, rollout.prompt_token_ids(prompts, 32)))
    assert len(out.tokens) == 40
    assert engine.prefill_counts.computed - before <= unique + 40
    state = pool_state(engine)
    assert state["running"] == state["waiting"] == 0


@pytest.mark.parametrize("caller", ["main thread", "thread after asyncio.run"])
def test_early_stop_returns_the_first_complete_groups_and_frees_the_rest(rollout, caller):
    """6 groups of 2; groups 0-2 end after 5 tokens, groups 3-5 would run 40. With
    need_groups=3 the call returns after the short groups: those rows equal the free run's
    tokens and logprobs (same seeds), the others come back None, and the engine holds nothing
    of them (no request running or queued, no KV held, every slot free or cached, stores
    empty). The same from a caller whose thread has no event loop (the aborts once failed
    there and the long groups ran to their end)."""
    engine = rollout.engine
    prompts = [engine.tokenizer.encode(f"group {g}: the quick brown fox") for g in range(6)]
    rows = [p for p in prompts for _ in range(2)]
    specs = [
        RequestSpec(SamplingOptions(seed=100 + i, temperature=1.0, return_entropy=True))
        for i in range(len(rows))
    ]
    everyone = [True] * len(rows)
    free = engine.generate(rows, specs, 40, ignore_eos=everyone)
    runner = engine.model_runner
    decode_steps = []
    forward = runner.forward

    def spy(batch, *args, **kwargs):
        decode_steps.append(bool(batch.forward_mode.is_decode()))
        return forward(batch, *args, **kwargs)

    flush(rollout)
    runner.forward = spy

    def early_stop():
        return engine.generate(
            rows,
            specs,
            [5] * 6 + [40] * 6,
            ignore_eos=everyone,
            groups=[i // 2 for i in range(len(rows))],
            need_groups=3,
        )

    try:
        got = early_stop() if caller == "main thread" else after_asyncio_run(early_stop)
    finally:
        del runner.forward
    assert [c is not None for c in got] == [True] * 6 + [False] * 6
    for c, f in zip(got[:6], free, strict=False):
        assert c.tokens == f.tokens[:5]
        np.testing.assert_allclose(c.logprobs, f.logprobs[:5], atol=1e-6)
        np.testing.assert_allclose(c.entropy, f.entropy[:5], atol=1e-6)
    assert sum(decode_steps) < 10, decode_steps  # the long groups' 39 decode steps never ran
    state = pool_state(engine)
    assert state["running"] == state["waiting"] == state["held"] == 0, state
    assert state["free"] + state["cached"] == state["size"], state
    assert not set(engine._engine.tokenizer_manager.rid_to_state) & {c.rid for c in free}


def test_generate_groups_keeps_whole_groups_in_prompt_order(rollout):
    """The rollout's over-sampling call: `groups_needed` groups of n adjacent samples, their
    prompt indices, and a layout tunix reads like `generate`'s."""
    prompts = [f"prompt {i}" for i in range(5)]
    out, kept = rollout.generate_groups(prompts, config(max_tokens_to_generate=6), 3, n=2)
    assert len(kept) == 3 and kept == sorted(kept) and set(kept) <= set(range(5))
    assert len(out.tokens) == len(out.logprobs) == len(out.text) == 6
    expected = [rollout.prompt_token_ids([prompts[k]], 32)[0] for k in kept for _ in range(2)]
    for row, ids in zip(out.left_padded_prompt_tokens, expected, strict=True):
        assert list(row[len(row) - len(ids) :]) == ids
        assert set(row[: len(row) - len(ids)]) <= {rollout.pad_id()}


def test_each_sample_stops_at_its_own_limit_and_keeps_it_when_paused(rollout, monkeypatch):
    """`max_tokens_per_sample` with EOS ignored: every returned sample is exactly its own
    length, with early stop, and with partial rollouts across two calls (the paused samples,
    aborted mid-way, keep their own limit when continued)."""
    cfg = config(max_tokens_to_generate=12, seed=5)
    limits = [1, 5, 2, 6, 3, 4]
    out, kept = rollout.generate_groups(
        ["a", "b", "c"], cfg, 3, n=2, ignore_eos=True, max_tokens_per_sample=limits
    )
    assert kept == [0, 1, 2] and [len(t) for t in out.tokens] == limits
    out, kept = rollout.generate_groups(
        ["a", "b", "c"], cfg, 1, n=2, ignore_eos=True, max_tokens_per_sample=limits
    )
    assert kept == [2] and [len(t) for t in out.tokens] == [3, 4]  # the first group done
    monkeypatch.setattr(rollout, "_partial_rollout", True)
    monkeypatch.setattr(rollout, "_paused", PausedGroups())
    try:
        limits = [2, 3, 9, 12, 3, 11]
        out1, kept1 = rollout.generate_groups(
            ["d", "e", "f"],
            cfg,
            1,
            ["d", "e", "f"],
            n=2,
            ignore_eos=True,
            max_tokens_per_sample=limits,
        )
        assert kept1 == ["d"] and [len(t) for t in out1.tokens] == [2, 3]
        assert rollout.paused_groups == 2
        out2, kept2 = rollout.generate_groups([], cfg, 2, [], n=2, ignore_eos=True)
        own = {"e": [9, 12], "f": [3, 11]}
        assert sorted(kept2) == ["e", "f"]
        for g, key in enumerate(kept2):
            assert [len(t) for t in out2.tokens[2 * g : 2 * g + 2]] == own[key]
    finally:
        rollout._paused.clear()


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(groups=[0, 0]), "set both or neither"),
        (dict(groups=[0], need_groups=1), "one per prompt"),
        (dict(groups=[0, 1], need_groups=3), r"need_groups must be an integer in \[1, 2\]"),
        (dict(groups=[0, 1], need_groups=0), r"need_groups must be an integer in \[1, 2\]"),
        (dict(max_new_tokens=[4]), "max_new_tokens has 1 entries for 2 prompts"),
    ],
)
def test_bad_groups_raise_before_the_engine(rollout, bad, match):
    spec = RequestSpec(SamplingOptions(seed=0))
    bad = {"max_new_tokens": 4, **bad}
    with pytest.raises(ValueError, match=match):
        rollout.engine.generate([[1, 2], [3, 4]], [spec, spec], **bad)


def quick_stops(tokens: list[list[int]], n: int, early: int = 6, late: int = 14) -> list[int]:
    """Stop ids (one per sample of a group) that end one group's n samples within `early`
    tokens while every other group keeps a sample running past `late`, read from a free run
    with the same seeds (stop ids do not change what is sampled)."""

    def end(row, stops):  # the row's length with `stops` as stop ids
        hits = [j for j, t in enumerate(row) if t in stops]
        return hits[0] + 1 if hits else len(row)

    groups = [tokens[g : g + n] for g in range(0, len(tokens), n)]
    for g, rows in enumerate(groups):
        for stops in itertools.product(*(row[1:early] for row in rows)):
            if all(
                max(end(r, stops) for r in other) > late for h, other in enumerate(groups) if h != g
            ):
                return list(stops)
    raise AssertionError("no stop ids split the groups; change the prompts or seed")


def test_partial_rollout_continues_paused_groups_under_the_new_weights(
    rollout, trainer, monkeypatch
):
    """Partial rollouts on the session engine (the rollout's own buffer, switched on here):
    call 1 needs 1 of 4 groups and pauses the other 3 mid-sample; after an update to other
    weights, call 2 continues them first. Every token carries the version that sampled it;
    each token's logprob equals the trainer's under that version's weights (the old prefix
    was recomputed under the new weights: the update flushed the prefix cache, and the new
    tokens' logprobs would differ from the trainer's otherwise). Then a paused group older
    than max_staleness is dropped, not continued."""
    prompts = [f"partial {i}: the quick brown fox" for i in range(4)]
    cfg = config(max_tokens_to_generate=24, seed=3)
    free = rollout.generate(prompts, cfg, n=2)
    stops = quick_stops([t.tolist() for t in free.tokens], 2)
    monkeypatch.setattr(rollout, "_partial_rollout", True)
    monkeypatch.setattr(rollout, "_paused", PausedGroups())
    original = jax.tree_util.tree_map(jnp.copy, nnx.state(trainer, nnx.Param))
    first_version = rollout.policy_version
    keys = [f"a{i}" for i in range(4)]
    out1, kept1 = rollout.generate_groups(prompts, cfg, 1, keys, n=2, stop_token_ids=stops)
    assert len(kept1) == 1 and len(out1.tokens) == 2 and rollout.paused_groups == 3
    assert all(set(v.tolist()) == {first_version} for v in out1.versions)
    new_state = perturbed_state(original, scale=0.05, seed=4)
    try:
        rollout.update_params(new_state)
        out2, kept2 = rollout.generate_groups(["fresh"], cfg, 3, ["b0"], n=2, stop_token_ids=stops)
        assert len(kept2) == 3 and rollout.paused_groups == 1
        assert set(kept2) <= set(keys) - set(kept1) | {"b0"}
        prompt_tokens, completions = padded(out2, rollout, 24)
        old = np.asarray(trainer_logps(trainer, rollout, prompt_tokens, completions)[0])
        nnx.update(trainer, new_state)
        new = np.asarray(trainer_logps(trainer, rollout, prompt_tokens, completions)[0])
        mixed = 0
        for i, (tokens, versions) in enumerate(zip(out2.tokens, out2.versions, strict=True)):
            assert len(tokens) == len(versions) == len(out2.logprobs[i]) <= 24
            assert np.all(np.diff(versions) >= 0)
            assert set(versions.tolist()) <= {first_version, first_version + 1}
            k = comparable(tokens, rollout.pad_id())
            stale = versions[:k] == first_version
            mixed += bool(stale.any() and (~stale).any())
            reference = np.where(stale, old[i, :k], new[i, :k])
            np.testing.assert_allclose(out2.logprobs[i][:k], reference, atol=1e-4)
        assert mixed >= 2  # samples that were paused mid-way and continued
        monkeypatch.setattr(rollout, "_max_staleness", 0)
        rollout.update_params(new_state)
        dropped = rollout.dropped_stale_groups
        rollout.generate_groups(["another"], cfg, 1, ["c0"], n=2, stop_token_ids=stops)
        assert rollout.dropped_stale_groups == dropped + 1
    finally:
        nnx.update(trainer, original)
        rollout.update_params(original)
        rollout._paused.clear()


def test_a_paused_sample_ending_at_the_abort_or_across_the_pause_is_finished_not_continued(
    rollout, monkeypatch
):
    """Greedy, 6 groups of one sample; group 0 stops at 4 tokens and the others are aborted 1-2
    steps later. sgl-jax appends one more token to an aborted request without a stop check,
    and a continuation matches stop strings in its own tokens only. Rows 1-4 get a stop id at
    index 4 or 5 (one of them is the unchecked token, wherever the abort lands), row 5 a stop
    string over its tokens 3-7 (across the pause). Each must end exactly there, its logprobs
    and versions aligned, and never be continued past it."""
    prompts = [f"a stop at the pause {i}" for i in range(6)]
    cfg = config(max_tokens_to_generate=24, seed=3, temperature=0.0)
    free = [t.tolist() for t in rollout.generate(prompts, cfg).tokens]
    ends = {0: 4, 1: 5, 2: 5, 3: 6, 4: 6, 5: 8}  # the length each row must have
    assert all(len(row) >= ends[i] for i, row in enumerate(free))  # no earlier model stop
    stop_ids = [free[i][ends[i] - 1] for i in (1, 2, 3, 4)]
    tokenizer = rollout.engine.tokenizer
    stop_text = tokenizer.decode(free[5][3:8])
    for i, row in enumerate(free):  # nothing ends a row before its designed end
        assert not set(row[: ends[i] - 1]) & set(stop_ids)
        assert stop_text not in tokenizer.decode(row[: ends[i] - 1])
    assert stop_text in tokenizer.decode(free[5][:8])
    monkeypatch.setattr(rollout, "_partial_rollout", True)
    monkeypatch.setattr(rollout, "_paused", PausedGroups())
    try:
        overrides = dict(stop_token_ids=stop_ids, stop=[stop_text])
        limits = [4] + [24] * 5
        out1, kept1 = rollout.generate_groups(
            prompts, cfg, 1, list(range(6)), max_tokens_per_sample=limits, **overrides
        )
        assert kept1 == [0] and out1.tokens[0].tolist() == free[0][:4]
        out2, kept2 = rollout.generate_groups([], cfg, 5, [], **overrides)
        assert sorted(kept2) == [1, 2, 3, 4, 5]
        for row, key in enumerate(kept2):
            assert out2.tokens[row].tolist() == free[key][: ends[key]], key
            assert len(out2.logprobs[row]) == len(out2.versions[row]) == ends[key]
        text = tokenizer.decode(out2.tokens[kept2.index(5)].tolist())
        assert out2.text[kept2.index(5)] == text[: text.find(stop_text)]  # the stop trimmed
    finally:
        rollout._paused.clear()


def test_accept_judges_each_group_as_it_finishes_and_drops_the_refused(rollout, monkeypatch):
    """slime's dynamic sampling on the engine: `accept(key, texts)` is asked once per finished
    group, with the texts it returns; only groups it passes count and come back. Fewer passing
    than needed: the call returns when every sample finished. With partial rollouts a refused
    group is dropped, not paused."""
    cfg = config(max_tokens_to_generate=8, seed=11)
    prompts = [f"judge {i}: the quick brown fox" for i in range(4)]
    asked = {}

    def accept(key, texts):
        asked[key] = texts
        return key != "a"

    out, kept = rollout.generate_groups(prompts, cfg, 2, list("abcd"), n=2, accept=accept)
    assert len(kept) == 2 and "a" not in kept and set(kept) <= set(asked)
    for g, key in enumerate(kept):
        assert out.text[2 * g : 2 * g + 2] == asked[key]
    asked.clear()
    out, kept = rollout.generate_groups(
        prompts, cfg, 2, list("abcd"), n=2, accept=lambda k, t: k == "d"
    )
    assert kept == ["d"] and len(out.tokens) == 2
    monkeypatch.setattr(rollout, "_partial_rollout", True)
    monkeypatch.setattr(rollout, "_paused", PausedGroups())
    try:
        out, kept = rollout.generate_groups(
            prompts, cfg, 3, list("wxyz"), n=2, accept=lambda key, texts: key != "x"
        )
        assert sorted(kept) == ["w", "y", "z"] and rollout.paused_groups == 0
    finally:
        rollout._paused.clear()


def test_group_sampler_goes_on_when_groups_paused_unjudged_are_refused(rollout, monkeypatch):
    """The review's reproduction (issue 81, point 1) through `GroupSampler` with slime's
    timing: a round stops when the group it needs passed, and a group that finished in the same
    step is paused unjudged; the next call judges it first and it is refused, leaving fewer
    unfinished groups than the call was asked for. That call used to raise `need_groups must
    be an integer in [1, N]` (and every later one with it); now it returns what it can and the
    sampler sends more. Every sample runs its full 4 tokens (`ignore_eos`), so the groups of a
    round finish in the same step. The refused group counts once as filtered."""
    from tunix_adapter.group_sampling import GroupSampler

    cfg = config(max_tokens_to_generate=4, seed=5)
    data = iter([{"prompts": [f"keep {c}", f"refuse {c}"]} for c in "cdefghij"])

    def score(groups, output):
        rewards = []
        for g, group in enumerate(groups):
            texts = output.text[2 * g : 2 * g + 2]
            refused = group.prompt.startswith("refuse")
            rewards += [1.0] * 2 if refused else [zlib.crc32(t.encode()) / 2**32 for t in texts]
        return {"rewards": np.asarray(rewards), "log_metrics": {}}

    monkeypatch.setattr(rollout, "_partial_rollout", True)
    monkeypatch.setattr(rollout, "_paused", PausedGroups())
    sampler = GroupSampler(
        n=2,
        filter_rule="slime",
        metric="reward",
        max_num_gen_batches=0,
        over_sampling_batch_size=None,
        generate=lambda prompts, keys, needed, accept=None: rollout.generate_groups(
            prompts, cfg, needed, keys, n=2, accept=accept, ignore_eos=True
        ),
        score=score,
        draw=lambda: next(data),
        paused_keys=lambda: rollout.paused_keys,
    )
    try:
        first = sampler.collect(sampler.split({"prompts": ["refuse a"] * 2 + ["keep b"] * 2}))
        assert [g.prompt for g in first.groups] == ["keep b", "keep c"]
        assert rollout.paused_keys and sampler._paused[rollout.paused_keys[0]].prompt == "refuse c"
        second = sampler.collect(sampler.split({"prompts": ["keep x"] * 2 + ["keep y"] * 2}))
        assert [g.prompt for g in second.groups] == ["keep x", "keep y"]
        assert second.stats.groups_filtered == 1 and second.stats.num_gen_batches == 2
        assert all(len(t) == 4 for t in second.output.tokens)
    finally:
        rollout._paused.clear()


def test_a_failing_accept_loses_no_paused_group_and_a_refused_one_stays_dropped(
    rollout, monkeypatch
):
    """Three groups paused complete and unjudged; the next call's `accept` refuses the first
    and raises on the second: the call fails, the refused group is gone, the other two are still
    paused (oldest first) and the next call judges them."""
    cfg = config(max_tokens_to_generate=4, seed=5)
    prompts = [f"paused {i}: the quick brown fox" for i in range(4)]
    monkeypatch.setattr(rollout, "_partial_rollout", True)
    monkeypatch.setattr(rollout, "_paused", PausedGroups())
    try:
        rollout.generate_groups(prompts, cfg, 1, list("abcd"), n=2, ignore_eos=True)
        paused = rollout.paused_keys
        assert len(paused) == 3

        def accept(key, texts):
            if key == paused[1]:
                raise RuntimeError("reward server down")
            return key != paused[0]

        with pytest.raises(RuntimeError, match="reward server down"):
            rollout.generate_groups([], cfg, 2, [], accept=accept, ignore_eos=True)
        assert rollout.paused_keys == paused[1:]
        out, kept = rollout.generate_groups(
            [], cfg, 2, [], accept=lambda key, texts: True, ignore_eos=True
        )
        assert kept == paused[1:] and rollout.paused_groups == 0
    finally:
        rollout._paused.clear()


@pytest.mark.parametrize("partial", [False, True])
def test_accept_judges_the_text_that_is_trained_cut_at_a_sampled_pad(rollout, monkeypatch, partial):
    """With `ignore_eos`, a sampled pad id ends the trained row (tunix reads every pad as
    padding): `accept` must see that row's text, not the uncut completion. The pad is made a
    token greedy decoding samples at index 3 of the first prompt's completion (the rollout's
    pad id switched on the session rollout; the engine is the real one)."""
    cfg = config(max_tokens_to_generate=8, seed=5, temperature=0.0)
    prompts = [f"trained text {i}: the quick brown fox" for i in range(3)]
    free = [t.tolist() for t in rollout.generate(prompts, cfg, ignore_eos=True).tokens]
    prompt_ids = {t for ids in rollout.prompt_token_ids(prompts, 32) for t in ids}
    pad = free[0][3]
    assert pad not in free[0][:3] and pad not in prompt_ids
    monkeypatch.setattr(rollout._tokenizer, "pad_id", lambda: pad)
    if partial:
        monkeypatch.setattr(rollout, "_partial_rollout", True)
        monkeypatch.setattr(rollout, "_paused", PausedGroups())
    asked = {}

    def accept(key, texts):
        asked[key] = texts
        return True

    try:
        out, kept = rollout.generate_groups(
            prompts, cfg, 3, [0, 1, 2], accept=accept, ignore_eos=True
        )
    finally:
        rollout._paused.clear()
    assert out.tokens[kept.index(0)].tolist() == free[0][:4]  # cut after the pad
    for row, key in enumerate(kept):
        assert asked[key] == [out.text[row]]
    assert asked[0] != [rollout.engine.tokenizer.decode(free[0])]
