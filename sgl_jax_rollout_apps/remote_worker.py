"""One rollout worker of tunix main's distributed RL, served over gRPC: a process of its own.

Owns `serve` and the process entry (`python -m sgl_jax_rollout_apps.remote_worker --port P
--model-path DIR --worker-id W`): our engine (`SglangJaxRollout`) behind `SglangJaxSampler`,
behind tunix's own `RolloutWorker`, bound to tunix's `GrpcRemoteExecutionServer`
(`tunix/experimental/worker/remote_execution.py` at c7d8950f), so an orchestrator in another
process calls the worker's methods by name (`sample_prompts`, `pre_weight_sync`,
`weight_sync`, `post_weight_sync`, `get_weight_sync_status`...), the weights travelling in the
`weight_sync` call (cloudpickle over gRPC, as tunix's remote execution sends every argument).

It prints one JSON line, `{"ready": PORT, "worker_id": W}`, once it serves, and serves until
SIGTERM or SIGINT; it then stops the gRPC server (the port is free again), the worker, the
sampler and the engine, and exits 0. tunix's server is insecure loopback only (its own note,
`remote_execution.py` `start_serving_async`): bind it to this machine's trusted network alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

logger = logging.getLogger(__name__)


def serve(model_path: str, port: int, worker_id: str, engine_settings: dict[str, Any]) -> None:
    """Builds the engine and serves the worker on `port` until SIGTERM / SIGINT."""
    from sgl_jax_rollout import tunix_compat as tc
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tunix_adapter.tunix_sampler import SglangJaxSampler

    rollout = SglangJaxRollout(model_path=model_path, engine_settings=engine_settings)
    try:
        tokenizer = rollout.engine.tokenizer
        sampler = SglangJaxSampler(worker_id, rollout)
        # sample_prompts and the weight-sync rounds use neither; tunix's worker requires both
        worker = tc.RolloutWorker(
            worker_id,
            sampler=sampler,
            tokenizer=tokenizer,
            chat_parser=tc.QwenChatTemplateParser(tokenizer),
        )
        worker.initialize()
        asyncio.run(_serve(tc.GrpcRemoteExecutionServer(worker), port, worker_id))
        worker.stop()
        asyncio.run(sampler.stop())
    finally:
        rollout.shutdown()


async def _serve(server: Any, port: int, worker_id: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start_serving_async(port=port)
    print(json.dumps({"ready": port, "worker_id": worker_id}), flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop_serving(grace=1.0)
    logger.info("worker %s stopped serving on port %d", worker_id, port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_jax_rollout_apps.remote_worker")
    parser.add_argument("--port", type=int, required=True, help="the gRPC port to serve on")
    parser.add_argument("--model-path", required=True, help="HF checkpoint dir")
    parser.add_argument("--worker-id", required=True, help="the worker's and sampler's id")
    parser.add_argument(
        "--engine-settings", default="{}", help="EngineSettings fields as a JSON object"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    # the engine reads the compilation cache from $SGL_JAX_ROLLOUT_COMPILATION_CACHE_DIR
    serve(args.model_path, args.port, args.worker_id, json.loads(args.engine_settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
