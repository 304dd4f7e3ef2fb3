"""One process of a simulated two-host run (tests/sgl_jax_rollout/engine/test_engine_per_host.py
starts it with `sgl-jax-rollout launch --processes 2 --devices-per-process 4`): joins the JAX
processes, builds an engine on this process's own 4 devices only, generates greedily and
prints the result as JSON (`RESULT {...}`): `python -m
tests.sgl_jax_rollout.engine.per_host_worker MODEL`.
"""

import json
import sys

from sgl_jax_rollout_apps.launch import initialize_from_env

PROMPTS = ["hello world", "the quick brown fox"]


def main() -> None:
    initialize_from_env()
    import jax

    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from tests.conftest import small_engine_settings

    local = tuple(d.id for d in jax.local_devices())
    rollout = SglangJaxRollout(
        model_path=sys.argv[1],
        engine_settings=small_engine_settings(tp_size=len(local), device_indexes=local),
    )
    try:
        config = RolloutConfig(max_tokens_to_generate=8, seed=0, return_logprobs=True)
        out = rollout.generate(PROMPTS, config, temperature=0.0)
        mesh = rollout.engine.model_runner.mesh
        result = {
            "process": jax.process_index(),
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "local_devices": sorted(local),
            "engine_devices": sorted(int(d.id) for d in mesh.devices.flat),
            "vocab_parallel": rollout.engine.vocab_parallel_sampler,
            "tokens": [[int(t) for t in row] for row in out.tokens],
            "logprobs": [[float(v) for v in row] for row in out.logprobs],
        }
        # on a line of its own: the engine's progress bars end their lines with "\r" only
        print("\nRESULT " + json.dumps(result), flush=True)
    finally:
        rollout.shutdown()


if __name__ == "__main__":
    main()
