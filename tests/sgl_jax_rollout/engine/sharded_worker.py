"""Runs one sharded engine on 8 simulated CPU devices and prints its results as JSON.

Started by tests/sgl_jax_rollout/engine/test_sharded.py in a subprocess (XLA_FLAGS must be set
before jax starts; one engine per process): `python -m
tests.sgl_jax_rollout.engine.sharded_worker MODEL TP DP [swap]`. Greedy tokens with raw logprobs
(the model's own log-softmax), and, with `swap`, the same after `update_params` with trainer
weights laid out fsdp = 4 x tp = 2 over all 8 devices.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import json  # noqa: E402
import sys  # noqa: E402

PROMPTS = ["hello world", "the quick brown fox", "a b c d e f", "one"]


def greedy(rollout, sampled: bool = False):
    """Greedy tokens with raw logprobs; `sampled`: seeded samples (temperature 0.7, top-k 20,
    a repetition penalty) with processed logprobs, which also tests every row's settings."""
    import numpy as np

    from sgl_jax_rollout.tunix_compat import RolloutConfig

    config = RolloutConfig(max_tokens_to_generate=16, seed=0, return_logprobs=True)
    if sampled:
        out = rollout.generate(
            PROMPTS, config, temperature=0.7, top_k=20, repetition_penalty=1.3, n=2
        )
    else:
        out = rollout.generate(PROMPTS, config, temperature=0.0, logprobs_mode="raw")
    return {
        "tokens": [[int(t) for t in row] for row in out.tokens],
        "logprobs": [[float(v) for v in row] for row in out.logprobs],
        "entropy": [[float(v) for v in row] for row in out.entropy],
        "prompt_ids": np.asarray(out.left_padded_prompt_tokens).tolist(),
    }


def shard_report(leaves):
    """Per leaf: global size, the largest single-device shard, and the device ids."""
    return [
        {
            "size": int(leaf.size),
            "largest_shard": max(int(s.data.size) for s in leaf.addressable_shards),
            "devices": sorted(int(d.id) for d in leaf.sharding.device_set),
        }
        for leaf in leaves
    ]


def main() -> None:
    model, tp, dp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    swap = sys.argv[4:] == ["swap"]
    import jax

    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tests.conftest import perturbed, small_engine_settings
    from tunix_adapter.models import load_tunix_model

    rollout = SglangJaxRollout(
        model_path=model, engine_settings=small_engine_settings(tp_size=tp, dp_size=dp)
    )
    try:
        result = {
            "devices": jax.device_count(),
            "vocab_parallel": rollout.engine.vocab_parallel_sampler,
            "before": greedy(rollout),
            "sampled": greedy(rollout, sampled=True),
        }
        runner = rollout.engine.model_runner
        result["engine"] = shard_report(runner.model_state_leaves)
        if swap:
            from flax import nnx

            mesh = jax.make_mesh(
                (4, 2), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2
            )
            trainer = load_tunix_model(model, mesh)
            state = perturbed(nnx.state(trainer, nnx.Param), scale=0.5, seed=1)
            result["trainer"] = shard_report(jax.tree_util.tree_leaves(state))
            engine_shardings = [leaf.sharding for leaf in runner.model_state_leaves]
            rollout.update_params(state)
            leaves = runner.model_state_leaves
            result["same_shardings"] = all(
                a.sharding == b for a, b in zip(leaves, engine_shardings, strict=True)
            )
            result["swapped"] = shard_report(leaves)
            result["program"] = program_memory(rollout, state)
            result["after"] = greedy(rollout)
            # the trainer's own logprobs of the swapped engine's greedy tokens
            nnx.update(trainer, state)
            result["trainer_logprobs"] = trainer_logprobs(trainer, rollout, result["after"])
        print("RESULT " + json.dumps(result))
    finally:
        rollout.shutdown()


def program_memory(rollout, state):
    """Per-device bytes of the compiled mapping program (temporaries and outputs), and the
    bytes of one full copy of the weights."""
    import jax

    weights = rollout.engine._weights
    src_leaves, src_def = jax.tree_util.tree_flatten(state)
    moved = weights._on_engine_devices(src_leaves)
    dst = weights._runner.model_state_leaves
    # The mapping program's arguments: tree, LoRA tree (none), leaves, LoRA leaves, dst.
    program = weights._mapper.lower(src_def, None, moved, [], dst)
    stats = program.compile().memory_analysis()
    return {
        "temp_bytes": int(stats.temp_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "full_copy_bytes": int(sum(x.nbytes for x in src_leaves)),
        "moved": shard_report(moved),
    }


def trainer_logprobs(trainer, rollout, generated):
    import numpy as np
    from flax import nnx

    from sgl_jax_rollout.tunix_compat import compute_per_token_logps

    prompt_ids = np.asarray(generated["prompt_ids"], np.int32)
    pad = rollout.pad_id()
    completion = np.full((len(prompt_ids), 16), pad, np.int32)
    for i, row in enumerate(generated["tokens"]):
        completion[i, : len(row)] = row
    graphdef, state = nnx.split(trainer)
    logps = compute_per_token_logps(
        graphdef, state, prompt_ids, completion, pad_id=pad, eos_id=rollout.eos_id()
    )
    return np.asarray(logps).tolist()


if __name__ == "__main__":
    main()
