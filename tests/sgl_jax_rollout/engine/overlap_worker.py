"""Runs the overlap workload on an engine of its own and prints its results as JSON (one
engine per process: the tests' session engine is the other side of the comparison).

Started by tests/sgl_jax_rollout/test_overlap_engine.py: `python -m
tests.sgl_jax_rollout.engine.overlap_worker MODEL on|off`.
"""

import json
import sys

PROMPTS = ["hello world", "the quick brown fox jumps", "a b c d e f g h", "one", "x y"]
# Seeded requests of every kind whose per-token values depend on the request's own output:
# penalties, min_new_tokens, the step folded into each key; lengths differ, so some requests
# finish while others go on (with overlap, a finished request runs one more step).
CASES = {
    "sampled": dict(temperature=0.8, top_k=40, top_p=0.95, n=2),
    "penalties": dict(
        temperature=0.9, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4, n=2
    ),
    "min_new_tokens": dict(temperature=1.0, min_new_tokens=12, repetition_penalty=1.2),
    "raw_processed_entropy": dict(temperature=0.7, logprobs_mode="raw", entropy_source="processed"),
    "greedy": dict(temperature=0.0, frequency_penalty=0.3),
}


MAX_TOKENS = 20


def workload(rollout) -> dict:
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    config = RolloutConfig(max_tokens_to_generate=MAX_TOKENS, seed=5, return_logprobs=True)
    results = {"overlap": bool(rollout.engine._hooks.scheduler.enable_overlap)}
    for name, overrides in CASES.items():
        out = rollout.generate(PROMPTS, config, **overrides)
        results[name] = {
            "tokens": [[int(t) for t in row] for row in out.tokens],
            "logprobs": [[float(v) for v in row] for row in out.logprobs],
            "entropy": [[float(v) for v in row] for row in out.entropy],
        }
    return results


def main() -> None:
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tests.conftest import LISTED_SAMPLER_MODE, small_engine_settings

    overlap = {"on": True, "off": False}[sys.argv[2]]
    settings = small_engine_settings(sampler_modes=(LISTED_SAMPLER_MODE,), overlap_schedule=overlap)
    rollout = SglangJaxRollout(model_path=sys.argv[1], engine_settings=settings)
    try:
        print("RESULT " + json.dumps(workload(rollout)), flush=True)
    finally:
        rollout.shutdown()


if __name__ == "__main__":
    main()
