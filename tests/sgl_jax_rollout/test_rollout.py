"""SglangJaxRollout on the built-in tiny model, against tunix's trainer-side numbers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgl_jax_rollout.tunix_compat import RolloutConfig
from sgl_jax_rollout.utils.compiles import count_compiles
from tests.conftest import LISTED_SAMPLER_MODE
from tests.conftest import perturbed as perturbed_state

pytestmark = pytest.mark.engine

PROMPTS = [
    "the quick brown fox",
    "<think> a short thought",
    "héllo wörld, naïve café ✓",
    "1 2 3 4 5 6 7 8",
]


def config(**changes) -> RolloutConfig:
    base = dict(
        max_tokens_to_generate=24,
        max_prompt_length=32,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        seed=7,
        return_logprobs=True,
    )
    base.update(changes)
    return RolloutConfig(**base)


def padded(out, rollout, width):
    completions = np.full((len(out.tokens), width), rollout.pad_id(), np.int32)
    for i, t in enumerate(out.tokens):
        completions[i, : len(t)] = t
    return jnp.asarray(out.left_padded_prompt_tokens), jnp.asarray(completions)


def comparable(tokens: np.ndarray, pad_id: int) -> int:
    """Positions tunix's trainer scores as real tokens: it treats a sampled pad id as padding
    (the random tiny model can sample it), so compare up to the first one."""
    hits = np.flatnonzero(np.asarray(tokens) == pad_id)
    return int(hits[0]) if hits.size else len(tokens)


def trainer_logps(trainer, rollout, prompts, completions, return_logits=False):
    from sgl_jax_rollout.tunix_compat import per_token_logps_and_logits

    graphdef, state = nnx.split(trainer)
    logps, logits = per_token_logps_and_logits(
        graphdef, state, prompts, completions, rollout.pad_id(), rollout.eos_id(), 1.0
    )
    return (logps, logits) if return_logits else (logps,)


def test_processed_logprobs_equal_tunix_trainer_recomputation(rollout, trainer):
    out = rollout.generate(PROMPTS, config(max_tokens_to_generate=64))
    width = 64
    prompts, completions = padded(out, rollout, width)
    reference = np.asarray(trainer_logps(trainer, rollout, prompts, completions)[0])
    for i, lp in enumerate(out.logprobs):
        assert len(lp) == len(out.tokens[i]) == len(out.entropy[i])
        k = comparable(out.tokens[i], rollout.pad_id())
        assert k >= 8
        np.testing.assert_allclose(lp[:k], reference[i, :k], atol=1e-4, rtol=0)


def test_decode_steps_with_the_same_requests_reuse_their_rows(rollout, monkeypatch):
    """Rows are built and moved to the device when a batch's requests or slots change, not
    at every decode step (the logprob tests above run on reused rows)."""
    from sgl_jax_rollout.engine import patches

    calls = {"build_rows": 0, "pack_rows": 0}
    for name in calls:
        original = getattr(patches.sampler_hooks, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(patches.sampler_hooks, name, counted)
    out = rollout.generate(PROMPTS, config(max_tokens_to_generate=24))
    # at most one build per extend step and per change of the running set (a request that
    # ends on EOS), far fewer than the 23 decode steps
    changes = len({len(t) for t in out.tokens})
    assert 1 <= calls["build_rows"] <= 2 + changes
    assert calls["pack_rows"] == calls["build_rows"]


def test_a_call_is_prefilled_as_one_batch(rollout):
    """A call's requests start as one prefill, in two situations that split it before:
    - patches.whole_calls: upstream's tokenizer manager sends a call's requests one message
      each and its scheduler took what had arrived, so a call's first request or two were
      often prefilled alone (in 5 of 6 calls of the benchmark's workloads with overlap off).
      Here the sends are also spread out, 3 ms apart (a busy host).
    - patches.finished_leave_first: a call that reaches the scheduler before its next turn
      after the previous call's outputs found that call's finished requests still in the
      running batch, holding slots (12 of the engine's 16 after a call of 4). Here the
      scheduler is held, right after sending a call's last outputs, until the next call is
      sent, as a fast caller on a busy host gets it."""
    scheduler = rollout.engine._hooks.scheduler
    runner = rollout.engine.model_runner
    manager = rollout.engine._engine.tokenizer_manager
    send, process = manager._send_one_request, scheduler.process_batch_result
    prompts = [f"prompt {i}: " + "a b " * i for i in range(16)]  # the engine's 16 slots
    next_call_sent = threading.Event()
    sent, held = [], []  # request ids in send order (the pair's first call, then the second)

    def slow_send(obj, tokenized, *args, **kwargs):
        state = send(obj, tokenized, *args, **kwargs)
        time.sleep(0.003)
        sent.append(tokenized.rid)
        if len(sent) == len(PROMPTS) + len(prompts):
            next_call_sent.set()
        return state

    def hold_after_first_call(batch, *args, **kwargs):
        reqs = [req for info in batch.reqs_info for req in info.reqs or ()]
        finishing = not all(req.finished() for req in reqs)
        result = process(batch, *args, **kwargs)
        first_call = {req.rid for req in reqs} == set(sent[: len(PROMPTS)])
        if finishing and first_call and all(req.finished() for req in reqs):
            held.append(next_call_sent.wait(30))  # its outputs are sent: hold the scheduler
        return result

    steps = []
    forward = runner.forward

    def spy(forward_batch, *args, **kwargs):
        rows = int(np.sum(np.asarray(forward_batch.seq_lens) > 0))
        steps.append((bool(forward_batch.forward_mode.is_decode()), rows))
        return forward(forward_batch, *args, **kwargs)

    runner.forward, manager._send_one_request = spy, slow_send
    scheduler.process_batch_result = hold_after_first_call
    try:
        for seed in range(3):
            sent.clear()
            next_call_sent.clear()
            steps.clear()
            rollout.generate(PROMPTS, config(max_tokens_to_generate=4, seed=seed), ignore_eos=True)
            rollout.generate(prompts, config(max_tokens_to_generate=6, seed=seed), ignore_eos=True)
            assert [rows for decode, rows in steps if not decode] == [len(PROMPTS), 16], steps
            second = steps[steps.index((False, 16)) + 1 :]
            assert len(second) >= 5 and set(second) == {(True, 16)}, steps
    finally:
        del runner.forward, manager._send_one_request, scheduler.process_batch_result
    assert held == [True] * 3, held  # the scheduler was held once per pair, then released


def test_get_per_token_logps_equals_trainer_on_given_completions(rollout, trainer):
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(
        [[rollout.pad_id()] * 3 + list(rng.integers(10, 900, 5)), list(rng.integers(10, 900, 8))]
    )
    completions = rng.integers(10, 900, (2, 12)).astype(np.int32)
    # The last vocabulary id: sgl-jax reports it as 0 beside a logprob taken at the real id.
    last_id = rollout.engine.vocab_size - 1
    completions[0, 2] = completions[1, 0] = last_id
    completions[0, 9:] = rollout.pad_id()
    completions[1, 5] = rollout.eos_id()
    ours = np.asarray(rollout.get_per_token_logps(prompts, jnp.asarray(completions)))
    reference = np.asarray(trainer_logps(trainer, rollout, prompts, jnp.asarray(completions))[0])
    assert ours.shape == (2, 12)
    np.testing.assert_allclose(ours[0, :9], reference[0, :9], atol=1e-4, rtol=0)
    np.testing.assert_allclose(ours[1, :6], reference[1, :6], atol=1e-4, rtol=0)
    assert not ours[0, 9:].any() and not ours[1, 6:].any()


def test_raw_entropy_equals_numpy_reference_from_trainer_logits(rollout, trainer):
    out = rollout.generate(PROMPTS, config(temperature=0.7, top_k=20, top_p=0.9))
    prompts, completions = padded(out, rollout, 24)
    _, logits = trainer_logps(trainer, rollout, prompts, completions, return_logits=True)
    logits = np.asarray(logits, np.float64)
    for i, ent in enumerate(out.entropy):
        ent = ent[: comparable(out.tokens[i], rollout.pad_id())]
        z = logits[i, : len(ent)]
        z = z - z.max(-1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        expected = -(p * np.log(np.where(p > 0, p, 1))).sum(-1)
        np.testing.assert_allclose(ent, expected, atol=1e-4, rtol=0)


def test_greedy_tokens_equal_vanilla_rollout(rollout, trainer, tiny_dir):
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tunix_compat import CacheConfig, VanillaRollout

    cfg = trainer.config
    vanilla = VanillaRollout(
        trainer,
        AutoTokenizer.from_pretrained(tiny_dir),
        CacheConfig(
            cache_size=256,
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
        ),
    )
    # tunix's sampler divides by the temperature, so its greedy is top_k=1 (ours is too).
    rc = config(top_k=1, max_tokens_to_generate=20, eos_tokens=[rollout.eos_id()])
    theirs = vanilla.generate(PROMPTS, rc)
    ours = rollout.generate(PROMPTS, rc)
    for mine, other in zip(ours.tokens, theirs.tokens, strict=True):
        other = np.asarray(other).tolist()
        assert mine.tolist() == other[: len(mine)]


def repeated_rate(tokens: list[np.ndarray]) -> float:
    repeats = sum(len(t) - len(set(t.tolist())) for t in tokens)
    return repeats / sum(len(t) for t in tokens)


def test_repetition_penalty_lowers_repeated_token_rate(rollout):
    rc = config(max_tokens_to_generate=48, temperature=0.8, seed=[1, 2, 3, 4])
    plain = rollout.generate(PROMPTS, rc, ignore_eos=True)
    penalised = rollout.generate(PROMPTS, rc, ignore_eos=True, repetition_penalty=1.5)
    assert repeated_rate(penalised.tokens) < repeated_rate(plain.tokens)


def test_n_samples_are_adjacent_and_per_prompt_seeds_reproduce(rollout):
    rc = config(seed=[11, 12, 13, 14])
    first = rollout.generate(PROMPTS, rc, n=4)
    again = rollout.generate(PROMPTS, rc, n=4)
    assert len(first.tokens) == 16
    assert first.left_padded_prompt_tokens.shape == (16, 32)
    for p in range(4):
        rows = first.left_padded_prompt_tokens[4 * p : 4 * p + 4]
        assert (rows == rows[0]).all()
        samples = {tuple(t.tolist()) for t in first.tokens[4 * p : 4 * p + 4]}
        assert len(samples) > 1
    for a, b in zip(first.tokens, again.tokens, strict=True):
        assert a.tolist() == b.tolist()
    # Sample 0 of a prompt with seed s is the same in any batch.
    alone = rollout.generate(PROMPTS[2:3], config(seed=[13]))
    assert alone.tokens[0].tolist() == first.tokens[8].tolist()


def test_long_multibyte_completion_is_aligned_past_the_stream_chunk(rollout):
    rc = config(max_tokens_to_generate=120, max_prompt_length=32, seed=3)
    out = rollout.generate(["ü✓ naïve"] * 2, rc, ignore_eos=True)
    for t, lp, ent in zip(out.tokens, out.logprobs, out.entropy, strict=True):
        # all 120, or ended at a sampled pad id (as at a stop: `cut_at_pad`)
        assert len(t) == len(lp) == len(ent) and (len(t) == 120 or t[-1] == rollout.pad_id())
    assert max(len(t) for t in out.tokens) == 120
    # The engine's scoring, not get_per_token_logps: with ignore_eos a completion may hold an
    # EOS id, and ends with a sampled pad, where tunix's padded layout cuts it.
    (prompt,) = rollout._policy.prompt_ids(["ü✓ naïve"], 32)
    rescored = rollout.engine.score([prompt] * 2, [t.tolist() for t in out.tokens])
    for again, logprobs in zip(rescored, out.logprobs, strict=True):
        np.testing.assert_allclose(again, logprobs, atol=1e-4)


def test_stop_token_is_kept_with_one_value_per_token(rollout):
    probe = rollout.generate(PROMPTS, config(temperature=0.0, max_tokens_to_generate=16))
    stop = int(probe.tokens[0][5])
    out = rollout.generate(
        PROMPTS[:1], config(temperature=0.0, max_tokens_to_generate=16, eos_tokens=[stop])
    )
    tokens = out.tokens[0].tolist()
    assert tokens[-1] == stop and tokens.index(stop) == len(tokens) - 1
    assert len(out.logprobs[0]) == len(out.entropy[0]) == len(tokens)


def test_a_matched_stop_string_leaves_the_text_unless_the_call_keeps_it(rollout):
    """As sgl-jax's detokenizer, SGLang (`no_stop_trim`) and vLLM
    (`include_stop_str_in_output`) by default: the text ends before the stop string it matched;
    the tokens, logprobs and entropy keep every sampled token; either peer's option keeps it."""
    cfg = config(temperature=0.0, max_tokens_to_generate=16)
    free = rollout.generate(PROMPTS[:1], cfg).tokens[0].tolist()
    tokenizer = rollout.engine.tokenizer
    stop = tokenizer.decode(free[4:7])
    assert stop.strip() and stop not in tokenizer.decode(free[:6])
    trimmed = rollout.generate(PROMPTS[:1], cfg, stop=[stop])
    tokens = trimmed.tokens[0].tolist()
    assert tokens == free[: len(tokens)] and len(tokens) >= 7
    full = tokenizer.decode(tokens)
    assert stop in full and trimmed.text[0] == full[: full.find(stop)]
    assert len(trimmed.logprobs[0]) == len(tokens)
    for keep in (dict(no_stop_trim=True), dict(include_stop_str_in_output=True)):
        kept = rollout.generate(PROMPTS[:1], cfg, stop=[stop], **keep)
        assert kept.tokens[0].tolist() == tokens and kept.text[0] == full


def test_an_over_long_prompt_is_cut_with_one_warning_that_is_shown(rollout, caplog):
    """sgl-jax sets the root logger to its `log_level` ("error") when it starts, which hid
    every warning of the process: the engine keeps the root's level, and a call that cuts
    prompts says so once, with how many and their lengths."""
    import logging

    policy_logger = logging.getLogger("sgl_jax_rollout.request_policy")
    assert logging.getLogger().level <= logging.WARNING  # the session engine has started
    assert policy_logger.isEnabledFor(logging.WARNING)
    assert logging.getLogger("sgl_jax").getEffectiveLevel() == logging.ERROR
    with caplog.at_level(logging.WARNING, logger="sgl_jax_rollout"):
        out = rollout.generate(
            ["word " * 200, "a", "word " * 30],
            config(max_prompt_length=8, max_tokens_to_generate=2),
        )
    assert np.asarray(out.left_padded_prompt_tokens).shape[1] == 8
    (message,) = [r.getMessage() for r in caplog.records if "max_prompt_length" in r.getMessage()]
    lengths = [len(ids) for ids in rollout.prompt_token_ids(["word " * 200, "word " * 30], 10**6)]
    assert message.startswith("2 of 3 prompts are longer than max_prompt_length=8 tokens")
    assert message.endswith(f"0 ({lengths[0]}), 2 ({lengths[1]})")


def test_changing_sampling_settings_does_not_recompile(rollout):
    settings = [
        dict(temperature=0.5, top_k=5),
        dict(temperature=1.3, top_p=0.8),
        dict(temperature=0.0),
    ]
    overrides = [dict(min_p=0.1), dict(), dict(min_p=0.0)]
    for s, o in zip(settings, overrides, strict=True):  # warm every path once
        rollout.generate(PROMPTS, config(**s), **o)
    with count_compiles() as compiles:
        for s, o in zip(settings, overrides, strict=True):
            rollout.generate(PROMPTS, config(seed=99, **s), **o)
    assert compiles.count == 0


def test_sampler_modes_listed_in_the_settings_compile_at_start(rollout):
    # The session engine lists this mode (used by no other test) without return_logprobs: it
    # was compiled at start with and without logprobs, for every batch bucket.
    listed = LISTED_SAMPLER_MODE
    assert rollout.engine.settings.sampler_modes == (listed,)
    with count_compiles() as compiles:
        for return_logprobs in (True, False):
            out = rollout.generate(PROMPTS, config(return_logprobs=return_logprobs), **listed)
            assert all(len(e) == len(t) for e, t in zip(out.entropy, out.tokens, strict=True))
    assert compiles.count == 0
    with count_compiles() as compiles:  # a mode nobody listed compiles when first met
        rollout.generate(PROMPTS, config(), entropy_source="processed", entropy_top_k=40)
    assert compiles.count > 0


@pytest.mark.parametrize(
    "bad",
    [dict(top_p=1.5), dict(repetition_penalty=0.0), dict(no_such_option=1), dict(n=0)],
)
def test_invalid_overrides_raise_before_the_engine(rollout, bad):
    with pytest.raises(ValueError):
        rollout.generate(PROMPTS, config(), **bad)


@pytest.mark.parametrize("prompts", [[], [1, 2], ["ok", None]])
def test_bad_prompts_raise_value_error(rollout, prompts):
    with pytest.raises(ValueError):
        rollout.generate(prompts, config())


def test_default_sampling_params_come_from_generation_config(rollout):
    defaults = rollout.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (1.0, -1, 1.0)


def perturbed(trainer, scale=0.5, seed=0):
    return perturbed_state(nnx.state(trainer, nnx.Param), scale, seed)


def test_update_params_follows_trainer_weights_without_recompiling(rollout, trainer):
    rc = config(temperature=0.0, max_tokens_to_generate=16)
    before = rollout.generate(PROMPTS, rc)
    original = jax.tree_util.tree_map(jnp.copy, nnx.state(trainer, nnx.Param))
    new_state = perturbed(trainer)
    try:
        rollout.update_params(perturbed(trainer, seed=1))  # compiles tunix's eager mapping ops
        with (
            count_compiles() as compiles,
            jax.transfer_guard_device_to_host("disallow_explicit"),
            jax.transfer_guard_host_to_device("disallow_explicit"),
        ):
            rollout.update_params(new_state, (nnx.Param,))
        with count_compiles() as serving:
            after = rollout.generate(PROMPTS, rc)
        assert compiles.count == 0 and serving.count == 0
        nnx.update(trainer, new_state)
        assert any(
            a.tolist() != b.tolist() for a, b in zip(after.tokens, before.tokens, strict=True)
        )
        prompts, completions = padded(after, rollout, 16)
        reference = np.asarray(trainer_logps(trainer, rollout, prompts, completions)[0])
        _, logits = trainer_logps(trainer, rollout, prompts, completions, return_logits=True)
        for i, tokens in enumerate(after.tokens):
            k = comparable(tokens, rollout.pad_id())
            # Greedy under the new weights: each token is the trainer model's argmax.
            assert tokens[:k].tolist() == np.asarray(logits[i, :k]).argmax(-1).tolist()
            np.testing.assert_allclose(after.logprobs[i][:k], reference[i, :k], atol=1e-4)
    finally:
        nnx.update(trainer, original)
        rollout.update_params(original)
    restored = rollout.generate(PROMPTS, rc)
    assert [t.tolist() for t in restored.tokens] == [t.tolist() for t in before.tokens]


def test_wrong_shape_update_raises_and_keeps_serving_old_weights(rollout):
    rc = config(temperature=0.0, max_tokens_to_generate=12)
    before = rollout.generate(PROMPTS, rc)
    state = rollout.engine.engine_state()
    leaves, treedef = jax.tree_util.tree_flatten(state)
    bad = list(leaves)
    bad[-1] = jnp.zeros((3, 3), leaves[-1].dtype)
    with pytest.raises(ValueError, match=r"parameter .* has shape \(3, 3\)"):
        rollout.update_params(jax.tree_util.tree_unflatten(treedef, bad))
    after = rollout.generate(PROMPTS, rc)
    assert [t.tolist() for t in after.tokens] == [t.tolist() for t in before.tokens]


def edited(state, path, value=None):
    """A copy of `state` with the entry at `path` removed (value None) or set to `value`."""
    state = jax.tree_util.tree_map(lambda x: x, state)
    node = state
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return state


def test_incomplete_or_non_float_updates_raise_naming_the_parameter_and_keep_old_weights(
    rollout, trainer
):
    rc = config(temperature=0.0, max_tokens_to_generate=12)
    before = rollout.generate(PROMPTS, rc)
    state = nnx.state(trainer, nnx.Param)
    with pytest.raises(ValueError, match=r"does not cover 1 engine parameter.*up_proj"):
        rollout.update_params(edited(state, ("layers", 1, "mlp", "up_proj")))
    extra = nnx.Param(jnp.zeros((4, 4), jnp.float32))
    with pytest.raises(
        ValueError, match=r"1 parameter\(s\) of the new state have no mapping.*extra"
    ):
        rollout.update_params(edited(state, ("layers", 0, "mlp", "extra"), {"kernel": extra}))
    norm = state["final_norm"]["w"]
    as_int = nnx.Param(jnp.ones(norm.shape, jnp.int32))
    with pytest.raises(ValueError, match=r"floating dtype; not \['final_norm'\]\['w'\].*int32"):
        rollout.update_params(edited(state, ("final_norm", "w"), as_int))
    after = rollout.generate(PROMPTS, rc)
    assert [t.tolist() for t in after.tokens] == [t.tolist() for t in before.tokens]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_fifty_generate_update_cycles_leave_no_state_and_bounded_memory(rollout):
    rc = config(max_tokens_to_generate=8)
    state = rollout.engine.engine_state()
    for _ in range(3):  # allocator warm-up
        rollout.generate(PROMPTS, rc)
        rollout.update_params(state)
    start = rss_bytes()
    for i in range(50):
        rollout.generate(PROMPTS, config(max_tokens_to_generate=8, seed=i))
        rollout.update_params(state)
        assert rollout.engine.store_sizes()["records"] == 0
    growth = rss_bytes() / start - 1
    assert growth <= 0.05, f"resident memory grew {growth:.1%} over 50 cycles"


def test_patches_match_the_pinned_upstream_and_apply_once():
    from sgl_jax_rollout.engine import patches, upstream

    upstream.check()
    patches.apply()
    scheduler = upstream.get("Scheduler")
    before = scheduler.stream_output
    patches.apply()
    assert scheduler.stream_output is before


def test_every_engine_socket_has_linger_zero():
    """Engine sockets never wait on unsent messages (upstream's LINGER is -1)."""
    import zmq

    from sgl_jax_rollout.engine import patches, upstream

    patches.apply()
    context = zmq.Context()
    try:
        for module in map(upstream.module, upstream.SOCKET_MODULES):
            socket = module.get_zmq_socket(context, zmq.PULL, f"inproc://{module.__name__}", True)
            assert socket.getsockopt(zmq.LINGER) == 0, module.__name__
    finally:
        context.destroy(linger=0)


@pytest.mark.ends_session_engine
def test_shutdown_stops_the_engine_and_spares_unrelated_children(rollout):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    sockets = list(rollout.engine._hooks.sockets)
    # engine rpc, scheduler (4), tokenizer manager (2), detokenizer (2)
    assert len(sockets) >= 9
    try:
        rollout.shutdown()
        # An open socket left to the garbage collector hangs whichever thread finalises its
        # context (upstream never closes the detokenizer's).
        assert all(sock.closed for sock in sockets)
        assert child.poll() is None, "shutdown killed a process the engine did not start"
        with pytest.raises(RuntimeError, match="shut down"):
            rollout.generate(PROMPTS, config())
        import threading

        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith(("sglang::scheduler", "sglang-jax::detok"))]
    finally:
        child.kill()


def test_a_sampled_pad_ends_the_sample_so_the_trainer_scores_every_token(rollout, trainer):
    """With EOS ignored the random tiny model samples its pad id (id 0) mid-completion (this
    seed: in 3 of 16 rows). tunix reads every pad as padding, so tokens after one would be
    scored at shifted positions; the sample ends at the pad instead, as at a stop (the pad its
    last token, which tunix masks), and the trainer's logprob matches the rollout's on every
    other returned token."""
    prompts = [f"pad probe {i}: the quick" for i in range(16)]
    out = rollout.generate(prompts, config(max_tokens_to_generate=64, seed=2), ignore_eos=True)
    pad = rollout.pad_id()
    assert sum(len(t) < 64 for t in out.tokens) >= 2  # pads were sampled, and ended rows
    assert not any(pad in t.tolist()[:-1] for t in out.tokens)
    reference = np.asarray(trainer_logps(trainer, rollout, *padded(out, rollout, 64))[0])
    for i, (tokens, logprobs) in enumerate(zip(out.tokens, out.logprobs, strict=True)):
        k = comparable(tokens, pad)
        assert len(tokens) == len(logprobs) and k >= len(tokens) - 1
        np.testing.assert_allclose(logprobs[:k], reference[i, :k], atol=1e-4)


def test_generate_from_ids_samples_what_generate_samples_for_those_ids(rollout):
    """Token in: the ids `generate` sent, given back as ids, sample the same completions (same
    seeds); a prompt with no room left in the context, the pad id or no ids is refused by name
    before the engine."""
    from sgl_jax_rollout.rollout_inputs import prompt_rows

    rc = config(max_tokens_to_generate=8)
    out = rollout.generate(PROMPTS[:2], rc)
    ids = prompt_rows(out.left_padded_prompt_tokens, rollout.pad_id())
    again = rollout.generate_from_ids(ids, rc)
    np.testing.assert_array_equal(again.left_padded_prompt_tokens, out.left_padded_prompt_tokens)
    for a, b, la, lb in zip(again.tokens, out.tokens, again.logprobs, out.logprobs, strict=True):
        assert a.tolist() == b.tolist()
        np.testing.assert_allclose(la, lb, atol=1e-6, rtol=0)
    context = rollout.engine.settings.context_length
    long = ids[0] * (context // len(ids[0]) + 1)  # never cut: refused past the context
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] has \d+ tokens; with"):
        rollout.generate_from_ids([long], rc)
    with pytest.raises(ValueError, match="pad id"):
        rollout.generate_from_ids([[*ids[0], rollout.pad_id()]], rc)
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] must be a non-empty list"):
        rollout.generate_from_ids([ids[0], []], rc)
