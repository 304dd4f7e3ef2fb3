"""`SglangJaxSampler` on the session engine, under tunix main (tunix 0.1.7 has no
`tunix.experimental`): `sample` (prompt kinds, per-request params, per-request errors,
concurrency, load figures) against tunix's trainer, and weight-sync rounds driven by tunix's
own `RolloutWorker` (mirroring tunix's `tests/experimental/worker/
rollout_worker_weight_sync_test.py` with the real engine in place of its fake sampler)."""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import perturbed
from tests.sgl_jax_rollout.test_rollout import comparable, trainer_logps

pytestmark = [pytest.mark.engine, pytest.mark.tunix_main]

WIDTH = 64  # the trainer scores prompts and completions padded to these: one compiled shape
PROMPT_WIDTH = 64


def _requests(tc, **params):
    return tc.SamplingRequest(
        request_id=params.pop("request_id", ""),
        prompt=params.pop("prompt"),
        sampling_params=tc.TunixSamplingParams(**params),
    )


def _trainer_logps(trainer, rollout, response) -> np.ndarray:
    completion = np.full((1, WIDTH), rollout.pad_id(), np.int32)
    completion[0, : len(response.token_ids)] = response.token_ids
    prompt = np.full((1, PROMPT_WIDTH), rollout.pad_id(), np.int32)
    prompt[0, PROMPT_WIDTH - len(response.prompt_token_ids) :] = response.prompt_token_ids
    logps = trainer_logps(trainer, rollout, jnp.asarray(prompt), jnp.asarray(completion))[0]
    return np.asarray(logps[0])


def _assert_aligned(trainer, rollout, response) -> None:
    k = comparable(response.token_ids, rollout.pad_id())
    reference = _trainer_logps(trainer, rollout, response)
    np.testing.assert_allclose(response.logprobs[:k], reference[:k], atol=1e-4)


def test_sample_serves_every_prompt_kind_and_answers_bad_requests_alone(rollout, trainer):
    from sgl_jax_rollout import tunix_compat as tc
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    sampler = SglangJaxSampler("s0", rollout)
    sampler.initialize()
    assert isinstance(sampler, tc.ExperimentalSampler)
    text = "the quick brown fox"
    ids = rollout.prompt_token_ids([text], 64)[0]
    requests = [
        _requests(tc, request_id="text", prompt=text, max_tokens=12, seed=1, return_logprobs=True),
        _requests(tc, request_id="ids", prompt=np.asarray(ids[1:]), max_tokens=3, seed=2),
        _requests(tc, request_id="chat", prompt=[{"role": "user", "content": "hi"}], seed=3),
        _requests(tc, request_id="beam", prompt=text, beam_size=2),
        _requests(tc, request_id="bad", prompt={"role": "user"}),
        _requests(tc, request_id="temp", prompt=text, temperature=-1.0),
        "1 2 3 4",  # a bare prompt: tunix's SamplingParams() defaults
    ]
    responses = asyncio.run(sampler.sample(requests, return_logprobs=True))
    by_id = {r.request_id: r for r in responses[:-1]}
    for name in ("beam", "bad", "temp"):
        assert by_id[name].finish_reason == "error" and by_id[name].token_ids.size == 0
    assert "beam_size" in by_id["beam"].error.message
    assert "prompt must be a string" in by_id["bad"].error.message
    assert "temperature" in by_id["temp"].error.message
    assert by_id["text"].prompt_token_ids.tolist() == ids  # encoded as generate encodes
    assert by_id["ids"].prompt_token_ids.tolist() == ids[1:]  # used as given
    assert by_id["ids"].finish_reason == "length" and len(by_id["ids"].token_ids) == 3
    chat = rollout.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True
    )
    assert by_id["chat"].prompt_token_ids.tolist() == list(chat)
    for response in (by_id["text"], by_id["ids"], by_id["chat"], responses[-1]):
        assert response.error is None and response.logprobs.shape == response.token_ids.shape
        assert response.metadata["policy_version"] == 0
        _assert_aligned(trainer, rollout, response)
    # seeded: the same request alone samples the same tokens
    alone = asyncio.run(sampler.sample(_requests(tc, prompt=text, max_tokens=12, seed=1)))
    assert alone.token_ids.tolist() == by_id["text"].token_ids.tolist() and alone.logprobs is None

    async def watched():
        many = [_requests(tc, prompt=text, max_tokens=WIDTH, seed=s) for s in range(16)]
        task = asyncio.ensure_future(sampler.sample(many))
        seen, held = [], None
        while not task.done():
            seen.append(await sampler.get_load_info())
            if len(seen) == 3:  # part-way: paused in place, the requests keep their KV
                await sampler.pause()
                held = await sampler.get_load_info()
                with pytest.raises(RuntimeError, match="paused in place.*resume it first"):
                    await sampler.pre_weight_sync(None)
                await asyncio.sleep(0.3)
                assert not task.done() and await sampler.get_load_info() == held
                await sampler.resume()
            await asyncio.sleep(0.02)
        return await task, seen, held, await sampler.get_load_info()

    done, seen, held, after = asyncio.run(watched())
    assert held.num_requests_running > 0 and held.kv_cache_usage_perc > 0
    assert all(r.error is None and r.finish_reason == "length" for r in done)
    busy = [s for s in seen if s.num_requests_running + s.num_requests_waiting]
    assert busy and all(0 < s.kv_cache_usage_perc <= 100 for s in busy)
    assert after.num_requests_running == after.num_requests_waiting == 0

    async def cancelled_then_stopped():
        long = [_requests(tc, prompt=text, max_tokens=300, seed=s) for s in range(2)]
        for _ in range(2):  # a cancelled task, then a stop, while the engine samples
            task = asyncio.ensure_future(sampler.sample(long))
            while not (await sampler.get_load_info()).num_requests_running:
                await asyncio.sleep(0.005)
            steps = rollout.engine._scheduler.forward_ct
            if task.cancel() and not await _cancelled(task):
                raise AssertionError("the sample task was not cancelled")
            assert rollout.engine.store_sizes()["records"] == 0
            while (await sampler.get_load_info()).num_requests_running:  # gone at the next step
                await asyncio.sleep(0.005)
            assert rollout.engine._scheduler.forward_ct - steps < 30  # aborted, not run out
            long = long[:1]
        task = asyncio.ensure_future(sampler.sample(long))
        while not (await sampler.get_load_info()).num_requests_running:
            await asyncio.sleep(0.005)
        await sampler.stop()
        return await task

    (stopped,) = asyncio.run(cancelled_then_stopped())
    assert stopped.finish_reason == "cancelled" and "was stopped" in stopped.error.message
    assert rollout.engine.store_sizes()["records"] == 0
    with pytest.raises(RuntimeError, match="stopped"):
        asyncio.run(sampler.sample(text))


async def _cancelled(task) -> bool:
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


def test_weight_sync_rounds_under_tunix_rollout_worker(rollout, trainer):
    from sgl_jax_rollout import tunix_compat as tc
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    sampler = SglangJaxSampler("s1", rollout)
    worker = tc.RolloutWorker(
        "w0", sampler=sampler, tokenizer=rollout.engine.tokenizer, chat_parser=object()
    )
    worker.initialize()
    text = "1 2 3 4 5 6 7 8"
    request = _requests(tc, prompt=text, max_tokens=WIDTH, seed=5, return_logprobs=True)

    def round_of(uuid, version):
        return tc.WeightSyncRequest(
            policy_version=version, extra_config={"req_id": f"r{uuid}", "uuid": uuid}
        )

    original = jax.tree_util.tree_map(jnp.copy, nnx.state(trainer, nnx.Param))
    new = perturbed(nnx.state(trainer, nnx.Param), seed=3)

    async def rounds():
        (host,) = await sampler.get_weight_sync_metadata()
        names = {p["path"] for p in host["params"]}
        assert len(names) == len(host["params"]) > 0 and all(p["shape"] for p in host["params"])
        bound = await sampler.bind_weight_sync()
        assert bound["transport"] == "weights_in_request" and bound["params"] == len(names)
        before = await sampler.sample(request)
        aborted = round_of(1, 1)
        await worker.pre_weight_sync(aborted)
        await worker.weight_sync(aborted, weights=new)
        staged = await sampler.sample(request)  # staging touches nothing
        await sampler.abort_weight_sync(aborted)
        await worker.abort_weight_sync(aborted)
        after_abort = await sampler.sample(request)
        with pytest.raises(RuntimeError, match="weight_sync"):
            await sampler.post_weight_sync(aborted)
        committed = round_of(2, 7)
        await worker.pre_weight_sync(committed)
        await worker.weight_sync(committed, weights=new)
        racing = [sampler.sample(request) for _ in range(8)]
        post = asyncio.ensure_future(worker.post_weight_sync(committed))
        raced = await asyncio.gather(*racing, *(sampler.sample(request) for _ in range(8)))
        await post
        return before, staged, after_abort, raced, await sampler.get_weight_sync_round()

    try:
        before, staged, after_abort, raced, report = asyncio.run(rounds())
        for same in (staged, after_abort):  # the previous weights, bit for bit
            assert same.token_ids.tolist() == before.token_ids.tolist()
            assert same.logprobs.tobytes() == before.logprobs.tobytes()
        assert report == {"req_id": "r2", "uuid": 2, "phase": "committed", "policy_version": 7}
        versions = {r.metadata["policy_version"] for r in raced}
        assert versions <= {0, 7} and 7 in versions
        for response in raced:  # each completion scored under the version that sampled it
            nnx.update(trainer, original if response.metadata["policy_version"] == 0 else new)
            _assert_aligned(trainer, rollout, response)
    finally:
        nnx.update(trainer, original)
        rollout.update_params(original)


def test_repeated_stale_or_stopped_weight_sync_deliveries_touch_nothing(rollout, trainer):
    """tunix's `rollout_worker_weight_sync_test` (idempotency, staleness, stop against the
    phases) with the real engine: c7d8950f's worker passes every delivery on to the sampler,
    so the sampler keeps them apart. A repeated pre / weight / post swaps the engine once; a
    phase of a round never opened, or of the previous round once the next is open, raises
    naming it; after `stop` the open round never reaches the engine."""
    from sgl_jax_rollout import tunix_compat as tc
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    sampler = SglangJaxSampler("s3", rollout)
    worker = tc.RolloutWorker(
        "w3", sampler=sampler, tokenizer=rollout.engine.tokenizer, chat_parser=object()
    )
    worker.initialize()
    original = jax.tree_util.tree_map(jnp.copy, nnx.state(trainer, nnx.Param))
    new = perturbed(nnx.state(trainer, nnx.Param), seed=4)
    start = rollout.engine.weights_version

    def round_of(uuid):
        return tc.WeightSyncRequest(
            policy_version=uuid, extra_config={"req_id": f"r{uuid}", "uuid": uuid}
        )

    async def deliveries():
        one, two = round_of(1), round_of(2)
        with pytest.raises(RuntimeError, match="post_weight_sync for .*'r1'.*must run first"):
            await sampler.post_weight_sync(one)
        for phase in ("pre_weight_sync", "weight_sync", "post_weight_sync"):
            for _ in range(2):  # each phase delivered twice
                kwargs = {"weights": new} if phase == "weight_sync" else {}
                await getattr(worker, phase)(one, **kwargs)
        swaps = rollout.engine.weights_version - start
        await worker.pre_weight_sync(two)
        with pytest.raises(RuntimeError, match="weight_sync for .*'r1'.*'r2'"):
            await sampler.weight_sync(one, weights=original)
        with pytest.raises(RuntimeError, match="abort_weight_sync for .*'r1'.*'r2'.* is open"):
            await sampler.abort_weight_sync(one)
        await worker.weight_sync(two, weights=original)
        await sampler.stop()
        with pytest.raises(RuntimeError, match="stopped"):
            await sampler.post_weight_sync(two)
        return swaps, await sampler.get_weight_sync_round()

    try:
        swaps, report = asyncio.run(deliveries())
        assert swaps == 1 and rollout.engine.weights_version == start + 1
        assert report == {"req_id": "r2", "uuid": 2, "phase": "h2d_done", "policy_version": 1}
    finally:
        rollout.update_params(original)


def test_a_round_without_keys_and_a_sampler_not_initialized(rollout):
    """tunix's `vanilla_sampler_adapter_test`: a round delivered with no round keys (`pre`,
    `weight_sync` with the weights in the request, `post`) swaps the weights in and counts a
    version (c7d8950f's vanilla adapter drops them: its `weight_sync` returns True untouched,
    `vanilla_sampler_adapter.py:313-316`); `sample` on a sampler not initialized raises
    RuntimeError."""
    from sgl_jax_rollout import tunix_compat as tc
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    pending = SglangJaxSampler("empty", build=lambda: rollout)
    with pytest.raises(RuntimeError, match="call initialize"):
        asyncio.run(pending.sample(tc.SamplingRequest(prompt="hello")))
    sampler = SglangJaxSampler("s4", rollout)
    sampler.initialize()
    start = rollout.engine.weights_version
    request = tc.WeightSyncRequest(extra_config={"weights": rollout.engine.engine_state()})

    async def plain_round():
        assert await sampler.pre_weight_sync()
        staged = await sampler.weight_sync(sync_request=request)
        return staged, await sampler.post_weight_sync(), await sampler.sample("1 2 3")

    staged, committed, response = asyncio.run(plain_round())
    assert (staged, committed) == (0, 1) and rollout.engine.weights_version == start + 1
    assert response.error is None and response.metadata["policy_version"] == 1


def test_agent_episodes_through_tunix_rollout_worker(rollout, trainer):
    """tunix's worker runs each episode (its `ModelAgent`, our `ScalarTaskEnvironment`) through
    its collector, which asks the sampler for each turn: the assistant segment is what the
    engine sampled, its logprobs the trainer's."""
    from sgl_jax_rollout import tunix_compat as tc
    from tunix_adapter.agentic import ScalarTaskEnvironment
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    tokenizer = rollout.engine.tokenizer
    scored = []

    class Pool:  # tunix's env pool: one environment per episode
        def acquire_env(self, config):
            return ScalarTaskEnvironment(
                {"prompts": "17 + 13 =", "answer": "30"},
                reward_fn=lambda task, action: scored.append(action) or 0.5,
            )

        def release_env(self, env):
            pass

    sampler = SglangJaxSampler("s2", rollout)
    worker = tc.RolloutWorker(
        "w1",
        sampler=sampler,
        env_pool=Pool(),
        agent_factory=lambda: tc.ModelAgent(system_prompt="Add."),
        tokenizer=tc.TokenizerAdapter(tokenizer),  # tunix's collector reads its dedup_bos_ids
        chat_parser=tc.QwenChatTemplateParser(tokenizer),
    )
    worker.initialize()
    kwargs = {"max_tokens": 12, "temperature": 1.0, "return_logprobs": True}
    requests = [
        tc.RolloutRequest(prompt_id=f"p{i}", generation_kwargs={**kwargs, "seed": i})
        for i in range(4)
    ]
    responses = asyncio.run(worker.generate(requests))
    assert len(scored) == 4, [r.error for r in responses]
    assert {tuple(r.segments[0].tokens) for r in responses} != {
        tuple(responses[0].segments[0].tokens)
    }
    for response in responses:
        assert response.status == "COMPLETED" and response.env_reward == 0.5
        (segment,) = response.segments
        sampled = tc.SamplingResponse(
            prompt_token_ids=np.asarray(response.prompt_tokens, np.int32),
            token_ids=np.asarray(segment.tokens, np.int32),
            logprobs=np.asarray(segment.logps, np.float32),
        )
        _assert_aligned(trainer, rollout, sampled)


def test_migrate_kv_cache_prefills_the_target_over_grpc(rollout):
    """tunix's manager moves a paused straggler's tokens to another sampler
    (`migrate_straggler`): ours prefill them on the target, here this process's engine behind
    a tunix worker served by tunix's gRPC server on localhost, so the trajectory continued
    there computes only its new tokens. An unknown target raises naming the peers."""
    import socket

    from sgl_jax_rollout import tunix_compat as tc
    from sgl_jax_rollout.engine.rows import RequestSpec
    from sgl_jax_rollout.sampling.options import SamplingOptions
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    engine = rollout.engine
    tokenizer = engine.tokenizer
    ids = tokenizer.encode("straggler " + " ".join(str(i * 7 % 97) for i in range(30)))
    target = SglangJaxSampler("t", rollout)
    worker = tc.RolloutWorker("wt", sampler=target, tokenizer=tokenizer, chat_parser=object())
    worker.initialize()
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    source = SglangJaxSampler("s", rollout, peers={"t": f"grpc://localhost:{port}"})

    async def migrate():
        server = tc.GrpcRemoteExecutionServer(worker)
        await server.start_serving_async(port=port)
        try:
            return await source.migrate_kv_cache(
                source_server_id="s", target_server_id="t", token_ids=ids, route_key="traj-0"
            )
        finally:
            await server.stop_serving()

    before = engine.prefill_counts.computed
    assert asyncio.run(migrate()) is True
    assert engine.prefill_counts.computed - before >= len(ids) - 1  # computed on the target
    tail = tokenizer.encode(" and then")
    before = engine.prefill_counts.computed
    engine.generate([ids + tail], [RequestSpec(SamplingOptions(seed=0))], 2)
    assert engine.prefill_counts.computed - before <= len(tail) + 1
    with pytest.raises(ValueError, match=r"no sampler 'elsewhere'.*peers \['t'\]"):
        asyncio.run(source.migrate_kv_cache("s", "elsewhere", ids))
