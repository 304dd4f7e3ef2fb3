"""tunix main's distributed RL over the wire on this machine: our rollout workers, each in a
process of its own served by tunix's gRPC remote execution, and an orchestrator loop here.

Owns `RemoteRunConfig` and `run`, the pattern of tunix's
`experimental/worker/examples/rl_loop_remote_execution_demo.py` (c7d8950f) with our workers
(`sgl_jax_rollout_apps.remote_worker`: `RolloutWorker(sampler=SglangJaxSampler(...))`) in place
of its mock. Each epoch every worker samples its prompts (`sample_prompts`, token-id prompts,
logprobs asked); this process's trainer (tunix's model of the same checkpoint) scores every
completion under the weights of that epoch. Between epochs the trainer's weights change (seeded
noise standing in for an update) and go to every worker in one weight-sync round,
`pre_weight_sync`, `weight_sync` (the weights in the call), `post_weight_sync`, as tunix's
coordinator drives it. At the end every worker gets SIGTERM and must exit 0 with its port free.

The report (`run`'s dict, the CLI's JSON): per epoch the policy version, each worker's view
of the round, rows, tokens and the largest |rollout - trainer| logprob gap, and after a round
the gap under the weights before it (which must be far wider: the round reached the workers);
`ok` when every gap is within `tolerance` and every such one beyond it, every worker exited 0
and every port is free again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

PROMPTS = (
    "the quick brown fox",
    "1 2 3 4 5",
    "why is the sky blue?",
    "a b c d",
    "once upon a time",
    "the cat sat on",
    "hello there,",
    "count: one, two,",
)
STOP_WAIT_S = 60.0  # how long a worker may take to exit after SIGTERM
UPDATE_SCALE = 0.05  # the stand-in update: noise of this times each weight's std


@dataclasses.dataclass(frozen=True)
class RemoteRunConfig:
    workers: int = 2
    epochs: int = 2
    prompts_per_worker: int = 2
    max_tokens: int = 16
    model_path: str | None = None  # default: the built-in tiny model
    seed: int = 0
    tolerance: float = 1e-4
    start_timeout_s: float = 900.0  # a cold start compiles the engine in each worker

    def __post_init__(self) -> None:
        limits = {
            "workers": (1, 8),
            "epochs": (1, 100),
            "prompts_per_worker": (1, len(PROMPTS)),
            "max_tokens": (1, 256),
        }
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
        if not self.tolerance > 0 or not self.start_timeout_s > 0:
            raise ValueError("tolerance and start_timeout_s must be > 0")


def run(config: RemoteRunConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Starts the workers, runs the loop, stops the workers; the report."""
    from sgl_jax_rollout.tiny_model.builder import default_model_dir
    from sgl_jax_rollout.utils.model_dir import load_tokenizer
    from tunix_adapter.models import load_tunix_model

    model_dir = Path(config.model_path) if config.model_path else default_model_dir()
    tokenizer = load_tokenizer(model_dir)
    trainer = load_tunix_model(model_dir)
    ports = _free_ports(config.workers)
    progress(f"starting {config.workers} rollout workers on ports {ports} ({model_dir})")
    workers = [_start_worker(model_dir, port, f"rollout-{i}") for i, port in enumerate(ports)]
    report: dict[str, Any] = {"model": str(model_dir), "ports": ports}
    try:
        started = time.perf_counter()
        _wait_ready(workers, config.start_timeout_s)
        report["start_s"] = round(time.perf_counter() - started, 1)
        progress(f"workers ready in {report['start_s']} s")
        report["epochs"] = asyncio.run(_loop(config, trainer, tokenizer, ports, progress))
    finally:
        report["worker_exit_codes"] = [_stop(worker) for worker in workers]
        report["ports_free"] = all(_port_free(port) for port in ports)
    gaps = [e["max_abs_logprob_diff"] for e in report["epochs"]]
    stale = [e.get("previous_weights_max_abs_diff", np.inf) for e in report["epochs"][1:]]
    report["ok"] = (
        max(gaps) <= config.tolerance
        and min(stale, default=np.inf) > config.tolerance
        and report["worker_exit_codes"] == [0] * config.workers
        and report["ports_free"]
    )
    return report


async def _loop(config, trainer, tokenizer, ports, progress) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout import tunix_compat as tc
    from tunix_adapter.check_weights import perturbed

    handles = [
        tc.RemoteActorHandle.from_address(f"grpc://localhost:{port}", rpc_timeout_s=600.0)
        for port in ports
    ]
    epochs, before = [], None
    try:
        for epoch in range(config.epochs):
            if epoch:  # a weight-sync round between epochs, to every worker
                before = jax.tree_util.tree_map(jnp.copy, nnx.state(trainer, nnx.Param))
                state = perturbed(before, UPDATE_SCALE, config.seed + epoch)
                nnx.update(trainer, state)
                request = tc.WeightSyncRequest(
                    policy_version=epoch, extra_config={"req_id": f"round-{epoch}", "uuid": epoch}
                )
                for phase, kwargs in (
                    ("pre_weight_sync", {}),
                    ("weight_sync", {"weights": state}),
                    ("post_weight_sync", {}),
                ):
                    await asyncio.gather(*(h.asubmit(phase, request, **kwargs) for h in handles))
            prompts = [_prompts(tokenizer, config, w) for w in range(len(handles))]
            outputs = await asyncio.gather(
                *(
                    h.asubmit(
                        "sample_prompts",
                        prompts[w],
                        max_generation_steps=config.max_tokens,
                        temperature=1.0,
                        seed=config.seed + 1000 * epoch + w,
                        return_logprobs=True,
                    )
                    for w, h in enumerate(handles)
                )
            )
            rounds = await asyncio.gather(*(h.asubmit("get_weight_sync_status") for h in handles))
            gap, tokens = _gap(trainer, tokenizer, prompts, outputs)
            epochs.append(
                {
                    "epoch": epoch,
                    "policy_version": epoch,
                    "worker_rounds": [_plain(r) for r in rounds],
                    "rows": sum(len(p) for p in prompts),
                    "tokens": tokens,
                    "max_abs_logprob_diff": gap,
                }
            )
            if before is not None:  # under the weights before the round: far apart
                now = nnx.state(trainer, nnx.Param)
                nnx.update(trainer, before)
                epochs[-1]["previous_weights_max_abs_diff"] = _gap(
                    trainer, tokenizer, prompts, outputs
                )[0]
                nnx.update(trainer, now)
            progress(json.dumps(epochs[-1]))
    finally:
        for handle in handles:
            with contextlib.suppress(Exception):
                await handle.close()
    return epochs


def _prompts(tokenizer, config: RemoteRunConfig, worker: int) -> list[np.ndarray]:
    start = worker * config.prompts_per_worker
    texts = [PROMPTS[(start + i) % len(PROMPTS)] for i in range(config.prompts_per_worker)]
    return [np.asarray(tokenizer.encode(t), np.int32) for t in texts]


def _gap(trainer, tokenizer, prompts, outputs) -> tuple[float, int]:
    """The largest |worker - trainer| logprob over every worker's completions (each up to its
    first pad id, which tunix's trainer reads as padding), and the tokens compared."""
    from tunix_adapter.scoring import before_pad, trainer_logps

    ids = _Ids(tokenizer)
    gap, compared = 0.0, 0
    for rows, out in zip(prompts, outputs, strict=True):
        width = max(len(r) for r in rows)
        padded = np.full((len(rows), width), ids.pad, np.int32)
        for i, row in enumerate(rows):
            padded[i, width - len(row) :] = row
        scored = _Scored([np.asarray(t) for t in out.tokens], padded)
        reference = trainer_logps(ids, trainer, scored, 1.0)
        for i, (tokens, logprobs) in enumerate(zip(out.tokens, out.logprobs, strict=True)):
            k = before_pad(tokens, ids.pad)
            if k:
                diff = np.abs(np.asarray(logprobs[:k]) - np.asarray(reference[i, :k]))
                gap, compared = max(gap, float(diff.max())), compared + k
    return gap, compared


@dataclasses.dataclass
class _Scored:
    """What `trainer_logps` reads of a rollout output."""

    tokens: list[np.ndarray]
    left_padded_prompt_tokens: np.ndarray


class _Ids:
    """The pad and EOS ids `trainer_logps` asks its rollout for, from the tokenizer (the pad
    as tunix's worker pads prompts: `pad_token_id`, else EOS)."""

    def __init__(self, tokenizer) -> None:
        self.eos = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad = int(pad if pad is not None else self.eos)

    def pad_id(self) -> int:
        return self.pad

    def eos_id(self) -> int:
        return self.eos


def _plain(value: Any) -> Any:
    """`value` as JSON can hold it (numbers and strings as they are, the rest as strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET6) as sock:
        try:
            sock.bind(("::", port))  # where tunix's server listens ([::]:port)
        except OSError:
            return False
    return True


def _start_worker(model_dir: Path, port: int, worker_id: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "sgl_jax_rollout_apps.remote_worker"]
    command += ["--port", str(port), "--model-path", str(model_dir), "--worker-id", worker_id]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=dict(os.environ))


def _wait_ready(workers: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        line = ""
        while not line.startswith("{") and worker.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"a rollout worker did not start within {timeout_s:.0f} s")
            if select.select([worker.stdout], [], [], min(left, 1.0))[0]:
                line = worker.stdout.readline()
        if worker.poll() is not None and not line.startswith("{"):
            raise RuntimeError(f"a rollout worker exited with {worker.returncode} while starting")
        logger.info("worker ready: %s", line.strip())


def _stop(worker: subprocess.Popen) -> int:
    """SIGTERM, then the exit code (SIGKILL after STOP_WAIT_S, reported as -9)."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    if worker.stdout is not None:
        worker.stdout.close()
    return worker.returncode
