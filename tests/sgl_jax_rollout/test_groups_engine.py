"""Groups on the real engine: a group's prompt prefilled once (`share_group_prefill`), and
over-sampling with early stop (`generate_groups`, `RolloutEngine.generate(need_groups=)`)."""

from __future__ import annotations

import numpy as np
import pytest

from sgl_jax_rollout.engine.rows import RequestSpec
from sgl_jax_rollout.sampling.options import SamplingOptions
from tests.sgl_jax_rollout.test_rollout import comparable, config, padded, trainer_logps

pytestmark = pytest.mark.engine


def flush(rollout) -> None:
    """Empties the prefix cache (a weight update flushes it)."""
    rollout.update_params(rollout.engine.engine_state())


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
    prompt was computed once plus one token per sample (upstream's prefix match always leaves
    the last prompt token to compute); without, every copy computes its whole prompt. Same
    seeds give the same tokens, and the logprobs still equal the trainer's."""
    engine = rollout.engine
    prompts = [f"{i}: the quick brown fox jumps over the lazy dog {i}" for i in range(4)]
    cfg = config(max_tokens_to_generate=8, max_prompt_length=64)
    unique = sum(map(len, rollout.prompt_token_ids(prompts, 64)))
    outs, computed = {}, {}
    for share in (False, True):
        monkeypatch.setattr(engine, "settings", engine.settings.replace(share_group_prefill=share))
        flush(rollout)
        before = engine.prefill_counts.computed
        outs[share] = rollout.generate(prompts, cfg, n=4)
        computed[share] = engine.prefill_counts.computed - before
    rows = len(outs[True].tokens)
    assert computed[True] == unique + rows, computed
    assert computed[True] <= 1.1 * unique + rows
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


def test_early_stop_returns_the_first_complete_groups_and_frees_the_rest(rollout):
    """6 groups of 2; groups 0-2 end after 5 tokens, groups 3-5 would run 40. With
    need_groups=3 the call returns after the short groups: those rows equal the free run's
    tokens and logprobs (same seeds), the others come back None, and the engine holds nothing
    of them (no request running or queued, no KV held, every slot free or cached, stores
    empty)."""
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
    try:
        got = engine.generate(
            rows,
            specs,
            [5] * 6 + [40] * 6,
            ignore_eos=everyone,
            groups=[i // 2 for i in range(len(rows))],
            need_groups=3,
        )
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
