"""tunix 0.1.7's own `SglangJaxRollout`, timed on the rollout benchmark's workloads.

Run as a subprocess by `rollout_bench` (`python -m sgl_jax_rollout_apps.bench.tunix_sglang_jax
MODEL_DIR SETTINGS_JSON RUNS`): our engine patches are process-wide, and tunix's rollout must
run on stock sgl-jax. Uses the same engine settings and the weights of MODEL_DIR (tunix loads
them into its trainer model and syncs them to the engine), and tunix's defaults otherwise
(overlap scheduling on, as its users run it). Prints one JSON object: tokens/s (median of
RUNS) per workload.
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def main(model_dir: str, settings_json: str, runs: int) -> dict:
    import jax
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from sgl_jax_rollout.tunix_compat import TunixSglangJaxRollout as SglangJaxRollout
    from sgl_jax_rollout_apps.bench.workloads import WORKLOADS, prompts
    from tunix_adapter.models import load_tunix_model

    settings = json.loads(settings_json)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_tunix_model(model_dir)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"))
    config = RolloutConfig(
        max_tokens_to_generate=64,
        max_prompt_length=64,
        temperature=1.0,
        top_p=1.0,
        rollout_sglang_jax_model_version=model_dir,
        rollout_sglang_jax_context_length=settings["context_length"],
        rollout_sglang_jax_disable_radix_cache=settings["disable_radix_cache"],
        rollout_sglang_jax_precompile_bs_paddings=list(settings["precompile_bs_paddings"]),
        rollout_sglang_jax_precompile_token_paddings=list(settings["precompile_token_paddings"]),
        rollout_sglang_jax_page_size=settings["page_size"],
        rollout_sglang_jax_max_running_requests=settings["max_running_requests"],
        rollout_sglang_jax_use_sort_for_toppk_minp=False,
        rollout_sglang_jax_log_level="error",
        rollout_sglang_jax_kwargs={
            "max_total_tokens": settings["max_total_tokens"],
            "max_prefill_tokens": settings["max_prefill_tokens"],
            "skip_server_warmup": True,
            "device": jax.default_backend(),
            "random_seed": 0,
        },
    )
    rollout = SglangJaxRollout(model, tokenizer, mesh, config)
    result = {}
    for name, (count, lengths, new_tokens) in WORKLOADS.items():
        batch = prompts(tokenizer, count, lengths)
        rc = RolloutConfig(**{**config.__dict__, "max_tokens_to_generate": new_tokens})
        rollout.generate(batch, rc, ignore_eos=True)  # warm-up
        rates = []
        for _ in range(runs):
            start = time.perf_counter()
            rollout.generate(batch, rc, ignore_eos=True)
            rates.append(count * new_tokens / (time.perf_counter() - start))
        result[name] = statistics.median(rates)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
    sys.stdout.flush()
    import os

    os._exit(0)  # tunix's engine registered an atexit shutdown that kills child processes
