"""tunix main's rollout worker on our engine: `SglangJaxSampler`.

tunix main's distributed RL serves rollouts through an engine-neutral `Sampler` protocol
(`tunix/experimental/rollout/sampler.py` at c7d8950f); its `RolloutWorker(sampler=...)`
drives one, and tunix ships adapters for its vanilla sampler and for vLLM. This is ours, on a
`SglangJaxRollout`. Importable only where tunix main is installed: under tunix 0.1.7 the
import raises `TunixIncompatible`, naming `tunix.experimental`.

- `sample`: requests as `sampler_requests` reads them. Each request is one call of the
  rollout, made from its own thread, so the requests of one `sample` call and of calls made
  at once share the engine's running batch (continuous batching across calls), each with its
  own options and seed; a request that fails is answered with its `error` (finish_reason
  "error") while the others complete. Every response carries the policy version that sampled
  it (`metadata["policy_version"]`), and the routed experts where the engine returns them.
  Each request samples in a `cancel_scope` of its own: a cancelled `sample` task aborts its
  requests in the engine (and returns once they have left the batch), and `stop` aborts those
  sampling then, answered with finish_reason "cancelled".
- Weight-sync rounds (`sampler_rounds`): `pre_weight_sync` returns once no `sample` call of
  this sampler runs; `weight_sync` stages the weights the request carries, touching nothing;
  `post_weight_sync` swaps them in: the engine lets the calls running finish under the old
  weights first and holds calls arriving meanwhile until it is done, so no completion mixes
  two versions; `abort_weight_sync` drops them, and the previous weights serve on, bit for
  bit. Weights come as tunix's in-process vLLM adapter takes them: a `weights=` keyword, the
  request's `weights` attribute or `extra_config["weights"]`, or a params tree in the
  request's place (tunix nnx state, or the engine's layout).
- `pause` / `resume`: in place (`RolloutEngine.pause`): the requests sampling keep their KV
  cache and continue at `resume`; `sample` calls arriving meanwhile wait. A weight-sync round
  refuses to open while paused. `stop` refuses later calls, resumes what this sampler paused,
  and shuts the engine down where this sampler built it.
- `get_load_info`: the engine's queues and KV pool now (`RolloutEngine.load`).
- `migrate_kv_cache`: the target computes the KV again. sgl-jax has no KV transport between
  engines at the pinned commit (tunix's, Raiden, needs TPU slices), so the target sampler
  prefills the tokens (one token sampled) and its prefix cache keeps them: the trajectory
  continued there prefills only what follows. The target is this sampler or one of `peers`,
  reached through its worker's gRPC server (tunix's remote execution, `sample_prompts`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from sgl_jax_rollout import tunix_compat
from sgl_jax_rollout.engine.cancel_scope import CancelScope, cancel_scope
from tunix_adapter import sampler_requests as requests_lib
from tunix_adapter.sampler_rounds import SyncRounds, round_key

try:
    _Protocol = tunix_compat.ExperimentalSampler
except tunix_compat.TunixIncompatible as err:
    raise tunix_compat.TunixIncompatible(
        f"SglangJaxSampler needs tunix main's distributed RL (tunix.experimental, its Sampler "
        f"protocol and rollout worker), which this tunix lacks: {err}"
    ) from None


class SglangJaxSampler(_Protocol):
    def __init__(
        self,
        server_id: str,
        rollout: Any = None,
        *,
        rollout_config: Any = None,
        max_concurrent_requests: int = 256,
        build: Callable[[], Any] | None = None,
        peers: Mapping[str, str] | None = None,
    ) -> None:
        """`rollout`: a `SglangJaxRollout` (its owner shuts it down), or `build`, a callable
        that makes one in `initialize` (this sampler then shuts it down at `stop`).
        `rollout_config`: what requests' `SamplingParams` do not set (max_prompt_length,
        penalties...; default tunix's `RolloutConfig()`). `max_concurrent_requests`: requests
        in flight at once (threads waiting on the engine). `peers`: other samplers' server ids
        -> the gRPC address of the tunix worker serving each ("grpc://host:port"), the targets
        `migrate_kv_cache` can reach."""
        if (rollout is None) == (build is None):
            raise ValueError("give exactly one of rollout and build")
        if max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {max_concurrent_requests}")
        self.server_id = server_id
        self._peers = dict(peers or {})
        self._rollout, self._build, self._owned = rollout, build, rollout is None
        self._defaults = rollout_config or tunix_compat.RolloutConfig()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_concurrent_requests, thread_name_prefix=f"sampler-{server_id}"
        )
        self._rounds = SyncRounds()
        self._versions = {0: 0}  # engine weights version -> policy version
        self._lock = threading.Lock()
        self._in_flight = 0
        self._scopes: set[CancelScope] = set()  # one per request sampling now
        self._stopped = False

    # --- Lifecycle & topology ---
    def initialize(self) -> None:
        if self._rollout is None:
            self._rollout = self._build()
        self._versions = {self._rollout.policy_version: self._rounds.policy_version}

    async def start(self, **kwargs: Any) -> bool:
        self.initialize()
        return True

    async def stop(self, **kwargs: Any) -> bool:
        """Refuses later calls, resumes generation where this sampler paused it; shuts the
        engine down where this sampler built it."""
        self._stopped = True
        with self._lock:
            for scope in self._scopes:  # their requests end, answered "cancelled"
                scope.cancel(f"sampler {self.server_id!r} was stopped")
        self._pool.shutdown(wait=False)
        if self._rollout is not None:
            if self._owned:
                self._rollout.shutdown()
            else:
                await asyncio.to_thread(self._rollout.engine.resume)
        return True

    async def pause(self, **kwargs: Any) -> bool:
        """Pauses generation in place: the requests sampling keep their KV cache."""
        await asyncio.to_thread(self._serving().engine.pause)
        return True

    async def resume(self, **kwargs: Any) -> bool:
        """Continues the requests `pause` held."""
        await asyncio.to_thread(self._serving().engine.resume)
        return True

    async def get_mesh(self, **kwargs: Any) -> Any:
        return self._serving().engine.model_runner.mesh

    # --- Inference ---
    async def sample(self, sampling_requests: Any, **kwargs: Any) -> Any:
        """Samples every request (a `SamplingRequest`, a bare prompt, or a list of them) at
        once; a list gives a list of `SamplingResponse`s in order, one request gives one.
        `kwargs`: `return_logprobs=True` asks logprobs of every request (as tunix's adapters
        read it); the rest are tunix's generation kwargs, which its collector also puts in
        each request's params, and are not read again."""
        if sampling_requests is None:
            raise ValueError("sampling_requests must be a request, a prompt or a list of them")
        one = not isinstance(sampling_requests, (list, tuple))
        batch = [sampling_requests] if one else list(sampling_requests)
        rollout = self._serving()
        logprobs = bool(kwargs.get("return_logprobs", False))
        scopes = [CancelScope() for _ in batch]
        with self._lock:
            self._in_flight += 1
            self._scopes.update(scopes)
        try:
            futures = [
                self._pool.submit(self._sample_one, rollout, r, logprobs, scope)
                for r, scope in zip(batch, scopes, strict=True)
            ]
            responses = await asyncio.gather(*map(asyncio.wrap_future, futures))
        except asyncio.CancelledError:  # the caller's task: its requests leave the engine
            for scope in scopes:
                scope.cancel("the sample call was cancelled")
            await asyncio.to_thread(concurrent.futures.wait, futures)  # aborted, they end
            raise
        finally:
            with self._lock:
                self._in_flight -= 1
                self._scopes.difference_update(scopes)
        return responses[0] if one else responses

    def _sample_one(
        self, rollout: Any, request: Any, return_logprobs: bool, scope: CancelScope
    ) -> Any:
        ids = None
        try:
            row = requests_lib.row_request(
                request, self._defaults, self._encode, self._chat, return_logprobs
            )
            ids = row.prompt_ids
            with cancel_scope(scope):
                output = rollout.generate_from_ids([row.prompt_ids], row.config)
            version = int(output.versions[0][0]) if len(output.tokens[0]) else None
            with self._lock:
                policy = self._versions.get(version, self._rounds.policy_version)
            return requests_lib.response(row, output, policy)
        except Exception as error:  # one request's failure is its own response
            if scope.cancelled:
                return requests_lib.cancelled_response(request, scope.future.result(), ids)
            return requests_lib.error_response(request, error, ids)

    def _encode(self, text: str) -> list[int]:
        return self._rollout.prompt_token_ids([text], max_prompt_length=2**31 - 1)[0]

    def _chat(self, messages: list[dict[str, Any]]) -> list[int]:
        ids = self._rollout.engine.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    # --- Weight synchronization ---
    async def bind_weight_sync(self, sync_request: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Binds nothing: the weights travel in the `weight_sync` call (in this process, or
        pickled by tunix's remote execution), so no buffer is registered ahead. Says so, with
        what serves now: the engine's parameter count and the policy version."""
        state = self._serving().engine.engine_state()
        return {
            "server_id": self.server_id,
            "transport": "weights_in_request",
            "params": len(jax.tree_util.tree_leaves(state)),
            "policy_version": self._rounds.policy_version,
        }

    async def get_weight_sync_metadata(self, **kwargs: Any) -> list[dict[str, Any]]:
        """Per host, the engine's parameters (path, shape, dtype, sharding) that
        `weight_sync` replaces; tunix nnx state in the trainer's layout is mapped onto them."""
        leaves = jax.tree_util.tree_flatten_with_path(self._serving().engine.engine_state())[0]
        params = [
            {
                "path": jax.tree_util.keystr(path),
                "shape": tuple(leaf.shape),
                "dtype": str(leaf.dtype),
                "sharding": str(getattr(leaf, "sharding", None)),
            }
            for path, leaf in leaves
        ]
        return [{"host": jax.process_index(), "server_id": self.server_id, "params": params}]

    async def pre_weight_sync(self, sync_request: Any = None, **kwargs: Any) -> bool:
        """Opens the round; returns once no `sample` call of this sampler runs."""
        if self._serving().engine.paused:
            raise RuntimeError(
                f"pre_weight_sync for round {round_key(sync_request)}: sampler "
                f"{self.server_id!r} is paused in place, so its requests would not end before "
                "the swap; resume it first"
            )
        self._rounds.prepare(sync_request)
        while self._in_flight:
            await asyncio.sleep(0.005)
        return True

    async def weight_sync(self, sync_request: Any = None, **kwargs: Any) -> int:
        """Stages the round's weights; returns the policy version serving (unchanged)."""
        self._rounds.stage(sync_request, _weights(sync_request, kwargs))
        return self._rounds.policy_version

    async def post_weight_sync(self, sync_request: Any = None, **kwargs: Any) -> int:
        """Swaps the staged weights in; returns the policy version now serving. A failed swap
        leaves the previous weights serving and the round staged."""
        rollout = self._serving()
        weights = self._rounds.to_commit(sync_request)
        if weights is None:  # committed already
            return self._rounds.policy_version
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, rollout.update_params, weights)
        with self._lock:
            policy = self._rounds.committed(sync_request)
            self._versions[rollout.policy_version] = policy
        return policy

    async def abort_weight_sync(self, sync_request: Any = None, **kwargs: Any) -> dict:
        """Drops the round's staged weights; the previous weights serve on."""
        self._rounds.abort(sync_request)
        return self._rounds.report()

    async def get_weight_sync_round(self, **kwargs: Any) -> dict[str, Any]:
        """{"req_id", "uuid", "phase", "policy_version"} of the last round."""
        return self._rounds.report()

    async def get_transfer_status(self, req_id: Any, **kwargs: Any) -> str:
        """The phase of round `req_id` ("prepared", "h2d_done", "committed", "aborted"), or
        "unknown" for a round other than the last."""
        report = self._rounds.report()
        return report["phase"] if report["req_id"] == req_id else "unknown"

    async def migrate_kv_cache(
        self, source_server_id: str, target_server_id: str, token_ids: list[int], **kwargs: Any
    ) -> bool:
        """Makes the KV cache of `token_ids` ready on sampler `target_server_id` (this one, or
        one of `peers`) by prefilling them there; True once done. `source_server_id` is only
        named: the source keeps its cache, which its engine evicts when it needs the room."""
        ids = requests_lib.prompt_ids(token_ids, self._encode, self._chat)
        if target_server_id == self.server_id:
            params = tunix_compat.TunixSamplingParams(max_tokens=1)
            request = tunix_compat.SamplingRequest(prompt=ids, sampling_params=params)
            response = await self.sample(request)
            if response.error is not None:
                raise RuntimeError(f"migrate_kv_cache: the prefill failed: {response.error}")
            return True
        if target_server_id not in self._peers:
            raise ValueError(
                f"migrate_kv_cache: no sampler {target_server_id!r} here: this one is "
                f"{self.server_id!r}, its peers {sorted(self._peers)} (SglangJaxSampler peers=)"
            )
        handle = tunix_compat.RemoteActorHandle.from_address(self._peers[target_server_id])
        try:
            out = await handle.asubmit(
                "sample_prompts", [np.asarray(ids, np.int32)], max_generation_steps=1
            )
        finally:
            await handle.close()
        if len(out.tokens[0]) != 1:
            raise RuntimeError(
                f"migrate_kv_cache: sampler {target_server_id!r} did not prefill the tokens"
            )
        return True

    async def get_load_info(self, **kwargs: Any) -> Any:
        load = self._serving().engine.load()
        return tunix_compat.SamplerLoadInfo(
            num_requests_waiting=load.waiting_requests,
            num_requests_running=load.running_requests,
            kv_cache_usage_perc=100.0 * load.kv_used_fraction,
        )

    def _serving(self) -> Any:
        if self._stopped:
            raise RuntimeError(f"SglangJaxSampler {self.server_id!r} is stopped")
        if self._rollout is None:
            raise RuntimeError(f"SglangJaxSampler {self.server_id!r}: call initialize() first")
        return self._rollout


def _weights(sync_request: Any, kwargs: dict[str, Any]) -> Any:
    if kwargs.get("weights") is not None:
        return kwargs["weights"]
    if getattr(sync_request, "weights", None) is not None:
        return sync_request.weights
    extra = getattr(sync_request, "extra_config", None) or {}
    if extra.get("weights") is not None:
        return extra["weights"]
    if sync_request is not None and not hasattr(sync_request, "extra_config"):
        return sync_request  # a params tree in the request's place
    raise ValueError(
        f"weight_sync for round {round_key(sync_request)}: no weights (looked for a weights= "
        "keyword, the request's weights attribute and extra_config['weights'])"
    )
