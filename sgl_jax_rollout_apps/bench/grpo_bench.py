"""`sgl-jax-rollout bench grpo`: wall time of whole GRPO steps, and where it goes.

Owns `run` (the benchmark's side) and `main` (one variant's worker: `python -m
sgl_jax_rollout_apps.bench.grpo_bench VARIANT MODEL_DIR SETTINGS_JSON STEPS WARMUP PASSES`). Each
variant trains in a process of its own (one engine per process; tunix's own sgl-jax rollout
must run on the engine as it ships, without our process-wide patches), one after another on a
quiet machine: the demo's task (its prompts and dense reward), `PROMPTS` prompts x `N` samples
x `MAX_TOKENS` tokens per step, no reference model, in two workloads (`WORKLOADS`): one pass
over each batch (tunix's loss then needs no old policy) and two passes (`num_iterations=2`:
the old policy's logprobs are needed). Variants:

- `ours_rollout_old`: `SglangJaxRollout` with `RolloutGRPOLearner`, the rollout's logprobs as
  the old policy (no trainer pass; the trainer-vs-rollout metrics off, as they cost a pass);
- `ours_trainer_old` (two passes): the same, the trainer's logprobs as the old policy;
- `ours_unshared_prefill` (one pass): `ours_rollout_old` with a group's n copies each
  prefilled (`share_group_prefill=False`, the engine before shared prefill);
- `ours_over_sample` (one pass): `ours_rollout_old` with over-sampling (r =
  `OVER_SAMPLE_RATE`) and partial rollouts (`group_sampling.py`);
- `ours_filter_groups` (one pass): `ours_rollout_old` with DAPO's dynamic sampling (verl's
  `filter_groups` rule, at most `MAX_NUM_GEN_BATCHES` rounds a step, then it fails by name);
- `tunix_sglang_jax`: tunix's own `RLCluster(rollout_engine="sglang_jax")` and `GRPOLearner`
  (its rollout returns no logprobs; tunix 0.1.7 asks it for the old policy's, and its
  `get_per_token_logps` raises a TypeError there: the variant reports the failure);
- `vanilla`: tunix's `RLCluster(rollout_engine="vanilla")` and `GRPOLearner`.

Every cluster method a phase runs through is timed (`PHASES`: the rollout call, the old
policy's logprobs, the trainer's update with its loss, the weight sync; with dynamic sampling,
its rounds count as rollout). A step runs from one `generate` call to the next (one step more
is trained than timed), so `other` is the rewards, advantages, data and metrics. After
`WARMUP` steps (compiles), `steps` are timed: the median step's seconds and each phase's share
of the summed steps. With `workers` > 1 each variant runs in that many processes, the variants
taken in turn (ours, vanilla, ours, vanilla, ...), and its timed steps are pooled: a
process's speed drifts (the same tunix update phase moved 10% between processes here), and
turns spread that drift over every variant alike. `ratios`: the median step of each other
variant over `ours_rollout_old`'s (above 1: ours is faster). The built-in model, and the
Qwen3-0.6B-size model (`real_size_model_dir`, few layers; `REAL_SIZE_WORKLOADS`) unless
`real_size_layers` is 0.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

# workload -> (passes over each batch, its variants). One pass needs no old policy (tunix's
# loss takes the current one); two need the old policy's logprobs.
WORKLOADS = {
    "one_pass": (
        1,
        (
            "ours_rollout_old",
            "ours_unshared_prefill",
            "ours_over_sample",
            "ours_filter_groups",
            "tunix_sglang_jax",
            "vanilla",
        ),
    ),
    "two_passes": (2, ("ours_rollout_old", "ours_trainer_old", "tunix_sglang_jax", "vanilla")),
}
PHASES = {
    "generate": "rollout",
    "get_old_per_token_logps": "old_policy",
    "update_actor": "loss_and_update",
    "sync_weights": "weight_sync",
}
# The real-size model's steps take ~40 s on a 2-core CPU: one workload there.
REAL_SIZE_WORKLOADS = ("one_pass",)
PROMPTS, N, MAX_TOKENS = 4, 4, 32
OVER_SAMPLE_RATE = 0.25
# verl's DAPO recipe scripts cap a step's rounds at 10; where no group's rewards vary (a
# random model that the reward never credits), the filter then fails instead of sampling on
MAX_NUM_GEN_BATCHES = 10
WARMUP = 2
REAL_SIZE_LAYERS = 2
# A batch bucket of the workload's rows (PROMPTS x N), as a user sizes the engine to the batch
# (16 rows padded to the next bucket ran the real-size model's 151,936-id LM head on 24 rows:
# its rollout phase took 5.7 s a step against 4.9 s); the larger one holds over-sampling's rows.
SETTINGS = dict(
    context_length=256,
    max_running_requests=32,
    precompile_bs_paddings=(4, PROMPTS * N, 32),
    precompile_token_paddings=(256, 1024),
    max_prefill_tokens=1024,
    max_total_tokens=4096,
    page_size=1,
    disable_radix_cache=False,
)
ANSWER = "@grpo "


def run(
    model_dir: str | Path | None = None,
    steps: int = 5,
    real_size_layers: int = REAL_SIZE_LAYERS,
    workers: int = 1,
    variants: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Every variant (or those of `variants`, `ours_rollout_old` always) on the built-in model
    (or `model_dir`) and the real-size model, each in `workers` processes taken in turn."""
    from sgl_jax_rollout.tiny_model import default_model_dir, real_size_model_dir

    if steps < 3:
        raise ValueError(f"steps must be >= 3 (a median of timed steps), got {steps}")
    chosen = check_variants(variants)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    models = {"builtin": Path(model_dir) if model_dir else default_model_dir()}
    if real_size_layers:
        models["real_size"] = real_size_model_dir(real_size_layers)
    result: dict[str, Any] = {
        "steps": steps,
        "warmup": WARMUP,
        "workers": workers,
        "workload": {
            "prompts": PROMPTS,
            "n": N,
            "max_tokens": MAX_TOKENS,
            "over_sample_rate": OVER_SAMPLE_RATE,
        },
    }
    plan = {label: list(WORKLOADS) for label in models}
    if "real_size" in plan:
        plan["real_size"] = list(REAL_SIZE_WORKLOADS)
    names_of = {w: [v for v in WORKLOADS[w][1] if v in chosen] for w in WORKLOADS}
    total = workers * sum(len(names_of[w]) for workloads in plan.values() for w in workloads)
    progress = tqdm(total=total, desc="bench grpo", file=sys.stderr)
    for label, path in models.items():
        result[label] = {"model": str(path), "engine_settings": _settings(path)}
        for workload in plan[label]:
            passes = WORKLOADS[workload][0]
            pooled: dict[str, Any] = {}
            for turn in range(workers):
                for variant in names_of[workload]:
                    progress.set_postfix_str(f"{label}, {workload}: {variant} ({turn + 1})")
                    pooled[variant] = _pooled(
                        pooled.get(variant), _worker(variant, path, steps, passes)
                    )
                    progress.update(1)
            variants = {
                name: times if "failed" in times else summary(times)
                for name, times in pooled.items()
            }
            result[label][workload] = {
                "num_iterations": passes,
                "variants": variants,
                "ratios": ratios(variants),
            }
    progress.close()
    return result


def check_variants(variants: tuple[str, ...] | None) -> tuple[str, ...]:
    """The variants to run: all by default; named ones must exist, and the reference
    `ours_rollout_old` (what `ratios` divides by) is always run."""
    known = sorted({v for _, names in WORKLOADS.values() for v in names})
    if not variants:
        return tuple(known)
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise ValueError(f"unknown bench grpo variant(s) {unknown}; known: {known}")
    return tuple(dict.fromkeys(("ours_rollout_old", *variants)))


def _pooled(so_far: dict[str, Any] | None, times: dict[str, Any]) -> dict[str, Any]:
    """One variant's timed steps over its workers, in turn order (a failed worker fails it)."""
    if so_far is None or "failed" in times:
        return times
    if "failed" in so_far:
        return so_far
    return {
        "step_s": so_far["step_s"] + times["step_s"],
        "phases_s": {k: so_far["phases_s"][k] + times["phases_s"][k] for k in times["phases_s"]},
    }


def summary(times: dict[str, Any]) -> dict[str, Any]:
    """Median step seconds and each phase's share of the timed steps' summed time."""
    total = sum(times["step_s"])
    shares = {name: sum(values) / total for name, values in times["phases_s"].items()}
    shares["other"] = 1.0 - sum(shares.values())
    return {
        "step_s_median": statistics.median(times["step_s"]),
        "step_s": times["step_s"],
        "phase_share": shares,
    }


def ratios(variants: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each variant's median step over `ours_rollout_old`'s (above 1: ours is faster)."""
    if "step_s_median" not in variants["ours_rollout_old"]:
        return {}
    ours = variants["ours_rollout_old"]["step_s_median"]
    return {
        f"{name}_over_ours_rollout_old": v["step_s_median"] / ours
        for name, v in variants.items()
        if name != "ours_rollout_old" and "step_s_median" in v
    }


def _worker(variant: str, model_dir: Path, steps: int, passes: int) -> dict[str, Any]:
    """One variant trained in a process of its own: its timed steps and phases, or the reason
    it failed (the last line of its error)."""
    command = [
        sys.executable,
        "-m",
        "sgl_jax_rollout_apps.bench.grpo_bench",
        variant,
        str(model_dir),
        json.dumps(_settings(model_dir)),
        str(steps),
        str(WARMUP),
        str(passes),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(ANSWER):
            return json.loads(line[len(ANSWER) :])
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    return {"failed": errors[-1] if errors else f"exit {done.returncode}"}


def _settings(model_dir: Path) -> dict[str, Any]:
    """The engine settings: the real-size model's 151,936-id vocabulary in a smaller batch."""
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    if vocab > 50_000:
        return dict(SETTINGS, max_running_requests=24, precompile_bs_paddings=(4, PROMPTS * N, 24))
    return SETTINGS


def main(argv: list[str]) -> None:
    variant, model_dir, settings, steps, warmup, passes = argv
    model_dir, settings = Path(model_dir), json.loads(settings)
    steps, warmup, passes = int(steps), int(warmup), int(passes)
    # one step more than timed (a step runs from one `generate` call to the next); tunix
    # counts an optimizer step per pass over a batch
    cluster, learner, close = _build(
        variant, model_dir, settings, passes, (warmup + steps + 1) * passes
    )
    starts: list[float] = []
    phases: dict[str, list[tuple[float, float]]] = {name: [] for name in PHASES.values()}
    for method, name in PHASES.items():
        _time(cluster, method, phases[name], starts if method == "generate" else None)
    if hasattr(cluster, "generate_groups"):  # dynamic sampling's rounds are rollout time
        _time(cluster, "generate_groups", phases["rollout"], None)
    from sgl_jax_rollout_apps.demo import prompts

    batches = ({"prompts": np.array(prompts(PROMPTS, 7 * s + 1))} for s in itertools.count())
    try:
        learner.train(batches)
    finally:
        close()
    bounds = starts[warmup : warmup + steps + 1]
    if len(bounds) != steps + 1:
        raise RuntimeError(f"{len(starts)} rollout calls for {warmup + steps + 1} steps")
    pairs = list(itertools.pairwise(bounds))
    timed = {
        name: [sum(t for s, t in spans if a <= s < b) for a, b in pairs]
        for name, spans in phases.items()
    }
    print(ANSWER + json.dumps({"step_s": [b - a for a, b in pairs], "phases_s": timed}), flush=True)


def _time(cluster: Any, method: str, spans: list, starts: list | None) -> None:
    """Times every call of the cluster's `method` (start, seconds) into `spans`."""
    original = getattr(cluster, method)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        if starts is not None:
            starts.append(start)
        try:
            return original(*args, **kwargs)
        finally:
            spans.append((start, time.perf_counter() - start))

    setattr(cluster, method, timed)


def _build(variant: str, model_dir: Path, settings: dict, passes: int, max_steps: int):
    """(cluster, learner, close) of one variant."""
    import jax
    import optax

    from sgl_jax_rollout.tunix_compat import RLTrainingConfig, RolloutConfig
    from tunix_adapter.rewards import vowel_word_reward

    training = RLTrainingConfig(
        actor_optimizer=optax.adam(1e-3), eval_every_n_steps=10**9, max_steps=max_steps
    )
    rollout_config = RolloutConfig(
        max_tokens_to_generate=MAX_TOKENS,
        max_prompt_length=16,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        seed=0,
        return_logprobs=True,
        kv_cache_size=128,
    )
    if variant.startswith("ours"):
        from tunix_adapter.cluster import build_cluster
        from tunix_adapter.learners import RolloutGRPOConfig, RolloutGRPOLearner

        over = variant == "ours_over_sample"
        cluster = build_cluster(
            rollout="sglang_jax",
            model_path=model_dir,
            rollout_config=rollout_config,
            training_config=training,
            engine_settings=dict(settings, share_group_prefill=variant != "ours_unshared_prefill"),
            with_reference=False,
            partial_rollout=over,
        )
        config = RolloutGRPOConfig(
            num_generations=N,
            num_iterations=passes,
            beta=0.0,
            use_rollout_logprobs=variant != "ours_trainer_old",
            log_trainer_logprobs=False,
            over_sampling_batch_size=math.ceil(PROMPTS * (1 + OVER_SAMPLE_RATE)) if over else None,
            filter_groups="verl" if variant == "ours_filter_groups" else None,
            max_num_gen_batches=MAX_NUM_GEN_BATCHES,
        )
        learner = RolloutGRPOLearner(
            rl_cluster=cluster, algo_config=config, reward_fns=[vowel_word_reward]
        )
        return cluster, learner, cluster.rollout.shutdown
    from sgl_jax_rollout.tunix_compat import ClusterConfig, GRPOConfig, GRPOLearner, RLCluster, Role
    from sgl_jax_rollout_apps.bench.tunix_sglang_jax import sglang_jax_fields
    from tunix_adapter.cluster import pad_safe_tokenizer
    from tunix_adapter.models import load_tunix_model

    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    actor = load_tunix_model(model_dir, mesh)
    if variant == "tunix_sglang_jax":
        fields = sglang_jax_fields(model_dir, settings)
        rollout_config = RolloutConfig(**{**rollout_config.__dict__, **fields})
    cluster = RLCluster(
        actor=actor,
        reference=None,
        tokenizer=pad_safe_tokenizer(model_dir, actor),
        cluster_config=ClusterConfig(
            role_to_mesh={role: mesh for role in Role},
            rollout_engine="sglang_jax" if variant == "tunix_sglang_jax" else "vanilla",
            training_config=training,
            rollout_config=rollout_config,
        ),
    )
    learner = GRPOLearner(
        rl_cluster=cluster,
        algo_config=GRPOConfig(num_generations=N, num_iterations=passes, beta=0.0),
        reward_fns=[vowel_word_reward],
    )
    return cluster, learner, lambda: None


if __name__ == "__main__":
    main(sys.argv[1:])
