"""`sgl-jax-rollout bench tail`: GRPO-shaped batches with long-tailed completion lengths.

Owns `run`. Each batch is `groups` prompts of `PROMPT_TOKENS` tokens, `n` samples each; every
sample's length is drawn from a log-normal (median `MEDIAN` of the limit, sigma `SIGMA`) capped
at `max_tokens`, seeded per batch, and enforced as that sample's own `max_new_tokens` with EOS
ignored, so every variant runs the same token counts. Variants, on one engine, each batch's
prefix cache flushed before each variant:

- `generate`: today's call without sharing (`share_group_prefill=False`);
- `shared_prefill`: the same call, a group's prompt prefilled once;
- `over_sample`: `ceil(groups * (1 + r))` groups submitted (the next prompts of the data, same
  length law), the call returning once `groups` groups are complete and aborting the rest;
- `partial_rollout`: the same number of groups per call through `generate_groups` on a
  rollout with `partial_rollout=True`, the groups paused by the last batch first (slime's
  buffer-first order) and new prompts after them; the rest of the call is paused, not
  aborted, and continued by the next batch after a weight update (the same weights, which
  flushes the prefix cache and moves the policy version, as a training step does). Each
  sample keeps its own drawn length across calls (`max_tokens_per_sample`); a continued
  sample's prompt and tokens so far are prefilled again under the new weights, so its prefill
  tokens per unique prompt token (of the batch's new prompts) exceed 1. Its time includes the
  rollout's own work around the engine call (tokenizing, the output's layout).

Reported per variant: wall time per batch, groups per second, decode steps run, mean running
batch per decode step, prefill tokens the engine computed (`RolloutEngine.prefill_counts`)
per unique prompt token; `ratios` to `generate`, and over-sampling to shared prefill (what
early stop adds alone). `ok`: over-sampling and partial rollouts each >= 1.3x `generate` in
groups per second and shared prefill <= 1.1x the unique prompt tokens. Each batch moves the
policy version by one, so only a group paused by two batches in a row is dropped as stale
(`dropped_stale_groups`, `max_staleness=1`). On CPU the engine attends through
`engine/paged_attention.py`, where a decode step's cost grows with its running rows: the
decode steps over-sampling and partial rollouts save show in the seconds only in part (on a
TPU a decode step of a few rows costs about what one row's does: the weights' read
dominates). The token and step counts carry over, the seconds do not.

`group_prefill` is point 1's measurement on its own: 16 prompts x n = 8 of 1,000 tokens, one
new token each, prefill tokens computed per unique prompt token with sharing off and on
(`group_prefill=False` skips it; `ok` then reads the speedups alone).

The KV pool is sized to the workloads (`SETTINGS`). With
`real_size_layers`, the same variants run again on the Qwen3-0.6B-sized model (its vocabulary,
widths and heads; that many layers), with the length cap halved and a smaller prefill bucket
and pool to fit this memory (`REAL_SIZE_SETTINGS`), reported under `real_size`.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

SETTINGS = dict(
    context_length=1100,
    max_running_requests=64,
    precompile_bs_paddings=(4, 16, 64),
    precompile_token_paddings=(256, 1024, 4096),
    max_prefill_tokens=4096,
    max_total_tokens=16640,
)
# The Qwen3-0.6B-sized model on CPU: sgl-jax's native attention holds [heads, prefill tokens,
# pool] scores, so its 16 heads need a smaller prefill bucket and pool (a 1,024-token bucket
# over a 16,640-token pool asked for 37.7 GB); the length cap is halved to fit the pool.
REAL_SIZE_SETTINGS = dict(
    context_length=512,
    max_running_requests=64,
    precompile_bs_paddings=(4, 16, 64),
    precompile_token_paddings=(256, 512),
    max_prefill_tokens=512,
    max_total_tokens=8192,
)
REAL_SIZE_MAX_TOKENS = 128
PROMPT_TOKENS, MEDIAN, SIGMA = 64, 1 / 8, 1.0
TARGET_SPEEDUP, TARGET_PREFILL = 1.3, 1.1
PREFILL_SHAPE = (16, 8, 1000)  # prompts, n, prompt tokens


def completion_lengths(rng: np.random.Generator, rows: int, limit: int) -> list[int]:
    """Long-tailed lengths: log-normal with median `MEDIAN * limit`, capped to [1, limit]."""
    raw = rng.lognormal(math.log(MEDIAN * limit), SIGMA, rows)
    return np.clip(np.round(raw), 1, limit).astype(int).tolist()


def run(
    model_dir: str | Path | None = None,
    groups: int = 8,
    n: int = 4,
    max_tokens: int = 256,
    over_sample_rate: float = 0.25,
    batches: int = 4,
    group_prefill: bool = True,
    real_size_layers: int = 0,
) -> dict[str, Any]:
    """The workload on the built-in model (or `model_dir`) with `SETTINGS`, then, where
    `real_size_layers` > 0, on the Qwen3-0.6B-sized model of that depth with
    `REAL_SIZE_SETTINGS` and `REAL_SIZE_MAX_TOKENS` (under `"real_size"`); `ok` needs both."""
    from sgl_jax_rollout.tiny_model import default_model_dir, real_size_model_dir

    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    workload = dict(groups=groups, n=n, over_sample_rate=over_sample_rate, batches=batches)
    result = _on_model(model_dir, SETTINGS, max_tokens, group_prefill, **workload)
    if real_size_layers:
        real = real_size_model_dir(real_size_layers)
        result["real_size"] = _on_model(
            real, REAL_SIZE_SETTINGS, REAL_SIZE_MAX_TOKENS, False, **workload
        )
        result["ok"] = result["ok"] and result["real_size"]["ok"]
    return result


def _on_model(
    model_dir: Path,
    settings: dict[str, Any],
    max_tokens: int,
    group_prefill: bool,
    groups: int,
    n: int,
    over_sample_rate: float,
    batches: int,
) -> dict[str, Any]:
    from sgl_jax_rollout.rollout import SglangJaxRollout

    rollout = SglangJaxRollout(model_path=model_dir, engine_settings=settings, partial_rollout=True)
    try:
        engine = rollout.engine
        spy = _StepSpy(engine.model_runner)
        submitted = math.ceil(groups * (1 + over_sample_rate))
        plan = {
            "generate": (False, groups, None),
            "shared_prefill": (True, groups, None),
            "over_sample": (True, submitted, groups),
            "partial_rollout": (True, submitted, groups),
        }
        totals = {name: _Totals() for name in plan}
        progress = tqdm(
            total=(batches + 1) * len(plan), desc=f"bench tail ({model_dir.name})", file=sys.stderr
        )
        for batch in range(-1, batches):  # batch -1 warms up (compiles), untimed
            texts, rows, specs, limits, unique = _batch(
                rollout, submitted, n, max_tokens, batch + 1
            )
            for name, (share, count, need) in plan.items():
                progress.set_postfix_str(f"batch {batch + 1}, {name}")
                take = count * n
                _flush(rollout, share, new_version=name == "partial_rollout")
                spy.reset()
                before = engine.prefill_counts.computed
                started = time.perf_counter()
                if name == "partial_rollout":
                    count = count - len(rollout.paused_keys)  # new prompts after the paused
                    out = _partial_call(
                        rollout,
                        texts[:count],
                        limits[: count * n],
                        (n, need, max_tokens, batch),
                        settings["context_length"],
                    )
                else:
                    out = engine.generate(
                        rows[:take],
                        specs[:take],
                        limits[:take],
                        ignore_eos=[True] * take,
                        groups=None if need is None else [i // n for i in range(take)],
                        need_groups=need,
                    )
                wall = time.perf_counter() - started
                if sum(c is not None for c in out) != groups * n:
                    raise RuntimeError(f"{name}: {groups} complete groups expected")
                if batch >= 0:
                    totals[name].add(
                        wall, spy, engine.prefill_counts.computed - before, unique[:count]
                    )
                progress.update()
        progress.close()
        variants = {name: t.summary(groups, batches) for name, t in totals.items()}
        base = variants["generate"]["groups_per_s"]
        ratios = {
            f"{name}_vs_generate": round(v["groups_per_s"] / base, 3)
            for name, v in variants.items()
            if name != "generate"
        }
        # What early stop adds on its own: both variants share the prefill.
        for name in ("over_sample", "partial_rollout"):
            ratios[f"{name}_vs_shared_prefill"] = round(
                variants[name]["groups_per_s"] / variants["shared_prefill"]["groups_per_s"], 3
            )
        prefill = _group_prefill(rollout) if group_prefill else None
        return {
            "model": str(model_dir),
            "engine_settings": settings,
            "workload": {
                "groups": groups,
                "n": n,
                "prompt_tokens": PROMPT_TOKENS,
                "max_tokens": max_tokens,
                "length_law": f"lognormal(median {MEDIAN} x max_tokens, sigma {SIGMA}), capped",
                "over_sample_rate": over_sample_rate,
                "groups_submitted_over_sampling": submitted,
                "batches": batches,
            },
            "variants": variants,
            "ratios": ratios,
            "group_prefill": prefill,
            "paused_groups_at_end": rollout.paused_groups,
            "dropped_stale_groups": rollout.dropped_stale_groups,
            "ok": ratios["over_sample_vs_generate"] >= TARGET_SPEEDUP
            and ratios["partial_rollout_vs_generate"] >= TARGET_SPEEDUP
            and (prefill is None or prefill["shared"]["per_unique_token"] <= TARGET_PREFILL),
        }
    finally:
        rollout.shutdown()


def _batch(rollout, groups: int, n: int, max_tokens: int, seed: int):
    """Prompt texts, rows (a group's n copies adjacent), seeded specs, per-row lengths and each
    group's unique prompt tokens, for batch `seed`."""
    from sgl_jax_rollout.engine.rows import RequestSpec
    from sgl_jax_rollout.sampling.options import SamplingOptions
    from sgl_jax_rollout_apps.bench.workloads import prompts

    rng = np.random.default_rng(seed)
    texts = prompts(rollout.engine.tokenizer, groups, (PROMPT_TOKENS, PROMPT_TOKENS), seed)
    texts = [f"{seed}.{g} {t}" for g, t in enumerate(texts)]
    ids = rollout.prompt_token_ids(texts, 1024)
    rows = [p for p in ids for _ in range(n)]
    specs = [
        RequestSpec(SamplingOptions(seed=seed * 10_000 + i, temperature=1.0))
        for i in range(len(rows))
    ]
    lengths = completion_lengths(rng, len(rows), max_tokens)
    return texts, rows, specs, lengths, [len(p) for p in ids]


def _partial_call(
    rollout, texts, limits, shape: tuple[int, int, int, int], context_length: int
) -> list[Any]:
    """One partial-rollout batch: the paused groups, then `texts`' groups; its samples
    (`shape`: n, groups needed, max tokens, batch index)."""
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    n, need, max_tokens, batch = shape
    config = RolloutConfig(
        max_tokens_to_generate=max_tokens,
        max_prompt_length=context_length - max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        seed=batch + 1,
    )
    keys = [(batch, g) for g in range(len(texts))]
    out, _ = rollout.generate_groups(
        texts, config, need, keys, n=n, ignore_eos=True, max_tokens_per_sample=limits
    )
    return list(out.tokens)


def _flush(rollout, share: bool, new_version: bool = False) -> None:
    """Empties the prefix cache and sets sharing; `new_version`: by a weight update of the
    same weights through the rollout, which moves its policy version as training does."""
    engine = rollout.engine
    if new_version:
        rollout.update_params(engine.engine_state())
    else:  # a weight swap here would move the version the paused groups' staleness counts
        engine.flush_prefix_cache()
    engine.settings = engine.settings.replace(share_group_prefill=share)


class _StepSpy:
    """Counts the model's forward steps: decode steps and the rows each one ran."""

    def __init__(self, runner) -> None:
        self.decode_rows: list[int] = []
        forward = runner.forward

        def counted(batch, *args, **kwargs):
            if batch.forward_mode.is_decode():
                self.decode_rows.append(int(np.sum(np.asarray(batch.seq_lens) > 0)))
            return forward(batch, *args, **kwargs)

        runner.forward = counted

    def reset(self) -> None:
        self.decode_rows = []


class _Totals:
    def __init__(self) -> None:
        self.wall = 0.0
        self.steps = 0
        self.rows = 0
        self.computed = 0
        self.unique = 0

    def add(self, wall: float, spy: _StepSpy, computed: int, unique: list[int]) -> None:
        self.wall += wall
        self.steps += len(spy.decode_rows)
        self.rows += sum(spy.decode_rows)
        self.computed += computed
        self.unique += sum(unique)

    def summary(self, groups: int, batches: int) -> dict[str, float]:
        return {
            "wall_s_per_batch": round(self.wall / batches, 3),
            "groups_per_s": round(groups * batches / self.wall, 3),
            "decode_steps_per_batch": self.steps / batches,
            "mean_running_rows_per_decode_step": round(self.rows / max(self.steps, 1), 2),
            "prefill_tokens_per_unique_prompt_token": round(self.computed / self.unique, 3),
        }


def _group_prefill(rollout) -> dict[str, Any]:
    """Point 1's figure: prefill tokens computed for `PREFILL_SHAPE` with sharing off and on."""
    from sgl_jax_rollout.engine.rows import RequestSpec
    from sgl_jax_rollout.sampling.options import SamplingOptions
    from sgl_jax_rollout_apps.bench.workloads import prompts

    count, n, length = PREFILL_SHAPE
    engine = rollout.engine
    texts = prompts(engine.tokenizer, count, (length, length), seed=99)
    ids = rollout.prompt_token_ids([f"{g} {t}" for g, t in enumerate(texts)], length)
    rows = [p for p in ids for _ in range(n)]
    specs = [RequestSpec(SamplingOptions(seed=i)) for i in range(len(rows))]
    unique = sum(map(len, ids))
    result: dict[str, Any] = {"prompts": count, "n": n, "unique_prompt_tokens": unique}
    for name, share in tqdm(
        (("shared", True), ("not_shared", False)), desc="bench tail: group prefill", file=sys.stderr
    ):
        _flush(rollout, share)
        before = engine.prefill_counts.computed
        engine.generate(rows, specs, 1)
        computed = engine.prefill_counts.computed - before
        result[name] = {"prefill_tokens": computed, "per_unique_token": round(computed / unique, 3)}
    return result
