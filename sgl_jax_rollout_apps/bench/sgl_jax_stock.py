"""The sgl-jax engine as it ships, timed on the rollout benchmark's workloads.

Run as a subprocess by `rollout_bench` (`python -m sgl_jax_rollout_apps.bench.sgl_jax_stock
MODEL_DIR SETTINGS_JSON RUNS OVERLAP [WORKLOADS_JSON]`): our engine patches are
process-wide, and this is the engine without them: its own sampler, no logprobs, no
entropy, what a user gets without us.
Same engine settings (`EngineSettings`) and prompt ids (BOS + the tokenizer's ids, as our
rollout sends them); `OVERLAP` (1 / 0) turns upstream's overlap scheduler on or off;
`WORKLOADS_JSON` replaces `workloads.WORKLOADS`.

Prints one JSON object, per workload: `tokens_per_s` (median of RUNS after a warm-up call),
and with overlap off the host time per step over RUNS more calls (medians), measured as
for our rollout (`engine.profiling.host_time`: wall time per model step minus the jitted model
and sampler calls). With overlap on, host work runs beside the device by design, so it is not
measured there.
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def main(
    model_dir: str, settings_json: str, runs: int, overlap: bool, workloads: dict | None = None
) -> dict:
    import jax
    from transformers import AutoTokenizer

    from sgl_jax_rollout import rollout_inputs as inputs
    from sgl_jax_rollout.engine import upstream
    from sgl_jax_rollout.engine.profiling import host_time
    from sgl_jax_rollout.engine.settings import EngineSettings
    from sgl_jax_rollout_apps.bench.workloads import WORKLOADS, prompts

    settings = EngineSettings(**json.loads(settings_json))
    args = settings.server_args(model_dir, jax.default_backend())
    args["disable_overlap_schedule"] = not overlap
    args["enable_engine_loop_run_forever_daemon"] = False  # stock `generate` runs the loop
    engine = upstream.get("Engine")(**args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bos = inputs.bos_prefix(tokenizer.bos_token_id)
    result = {}
    for name, (count, lengths, new_tokens) in (workloads or WORKLOADS).items():
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

        def call(ids=ids, params=params):
            engine.generate(input_ids=ids, sampling_params=[dict(params) for _ in ids])

        call()  # warm-up
        rates = []
        for _ in range(runs):
            start = time.perf_counter()
            call()
            rates.append(count * new_tokens / (time.perf_counter() - start))
        result[name] = {"tokens_per_s": statistics.median(rates)}
        if not overlap:
            runner = upstream.model_runner_of(upstream.scheduler_of(engine))
            result[name].update(host_time(runner, call, runs))
    return result


if __name__ == "__main__":
    workloads = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    out = main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", workloads)
    print(json.dumps(out))
    sys.stdout.flush()
    import os

    os._exit(0)  # upstream's Engine registered an atexit shutdown that kills child processes
