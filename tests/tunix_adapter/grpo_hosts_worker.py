"""One GRPO run of the demo on the `cpu-2host` preset, for tests/tunix_adapter/
test_grpo_hosts_engine.py: `python -m tests.tunix_adapter.grpo_hosts_worker STEPS`, either as
one process with 8 CPU devices or under `sgl-jax-rollout launch --processes 2
--devices-per-process 4` (each process then samples its half of every step's prompts).

Prints `RESULT {...}` (JSON): this process's index and count, its engine's devices, and per
step the rows it sampled (prompt, tokens, logprobs, reward), the trainer / rollout logprob
difference the learner measured on them (from step 1 on, the engine samples with weights
synced from the trainer, so that difference checks the sync), and the forking tokens
(`top_entropy_quantile=0.5`): the entropy threshold and how many of its completion tokens
carry loss.
"""

import json
import sys

import numpy as np

from sgl_jax_rollout_apps.launch import initialize_from_env


def main() -> None:
    initialize_from_env()
    import jax

    from sgl_jax_rollout_apps import demo
    from tunix_adapter.rewards import vowel_word_reward

    steps = int(sys.argv[1])
    config = demo.DemoConfig(
        preset="cpu-2host", steps=steps, show_progress=False, seed=3, top_entropy_quantile=0.5
    )
    cluster, learner = demo.build(config)
    kept = []
    produce = learner._generate_and_compute_advantage

    def counting(*args, **kwargs):
        example = produce(*args, **kwargs)
        kept.append(int((np.asarray(example.sampler_is_weights) > 0).sum()))
        return example

    learner._generate_and_compute_advantage = counting
    rollout = cluster.rollout
    sampled = []
    original = cluster.generate

    def recording(prompts, *args, **kwargs):
        out = original(prompts, *args, **kwargs)
        rewards = vowel_word_reward(list(prompts), out.text)
        sampled.append(
            [
                {
                    "prompt": str(p),
                    "tokens": [int(t) for t in tokens],
                    "logprobs": [float(v) for v in logprobs],
                    "reward": float(r),
                }
                for p, tokens, logprobs, r in zip(
                    prompts, out.tokens, out.logprobs, rewards, strict=True
                )
            ]
        )
        return out

    cluster.generate = recording  # what the learner calls, once per step here
    try:
        history = demo.train(config, cluster, learner, shutdown=False)
        result = {
            "process": jax.process_index(),
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "engine_devices": sorted(
                int(d.id) for d in rollout.engine.model_runner.mesh.devices.flat
            ),
            "steps": sampled,
            "logp_diff_max": [row["logp_diff_max"] for row in history],
            "forking_threshold": [row["rollout/forking_entropy_threshold"] for row in history],
            "forking_kept": kept,
        }
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        rollout.shutdown()


if __name__ == "__main__":
    main()
