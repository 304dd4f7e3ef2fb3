"""The sgl-jax engine as it ships, as calls on the rollout benchmark's workloads.

Owns `build`: the engine without our patches (`columns` builds it in a process of its own:
they are process-wide), its own sampler, no logprobs, no entropy, what a user gets without us.
Same engine settings (`EngineSettings`) and prompt ids (BOS + the tokenizer's ids, as our
rollout sends them); `overlap` turns upstream's overlap scheduler on or off. Its model runner
comes back too, for host time per step (`engine.profiling.host_time`), measured with overlap
off only: with it on, host work runs beside the device by design.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build(
    model_dir: Path, settings: dict, overlap: bool, workloads: dict
) -> tuple[dict[str, Callable[[], Any]], Any]:
    """Per workload, one `Engine.generate` call; and the engine's model runner."""
    import jax
    from transformers import AutoTokenizer

    from sgl_jax_rollout import rollout_inputs as inputs
    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.settings import EngineSettings
    from sgl_jax_rollout_apps.bench.workloads import prompts

    args = EngineSettings(**settings).server_args(str(model_dir), jax.default_backend())
    args["disable_overlap_schedule"] = not overlap
    args["enable_engine_loop_run_forever_daemon"] = False  # stock `generate` runs the loop
    engine = upstream.get("Engine")(**args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bos = inputs.bos_prefix(tokenizer.bos_token_id)
    calls = {}
    for name, (count, lengths, new_tokens) in workloads.items():
        ids = [
            bos + tokenizer.encode(text, add_special_tokens=False)
            for text in prompts(tokenizer, count, lengths)
        ]
        params = {
            "max_new_tokens": new_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "ignore_eos": True,
        }
        calls[name] = functools.partial(_generate, engine, ids, params)
    return calls, upstream.model_runner_of(upstream.scheduler_of(engine))


def _generate(engine, ids: list[list[int]], params: dict) -> None:
    engine.generate(input_ids=ids, sampling_params=[dict(params) for _ in ids])
