"""The rollout benchmark's engine columns, each built as calls ready to time.

Owns `Column` (per label, per workload, one call that makes `count x new_tokens` tokens; the
model runner where host time is measured; named one-off checks) and `build(worker, ...)`,
which builds one worker's column on an engine of its own (`turns` runs each in a process of
its own: our engine patches are process-wide, and one engine per process):
- `ours`: `SglangJaxRollout` with its defaults (overlap scheduling on), labels `ours_full`
  (logprobs and full-vocabulary entropy) and, with `plain`, `ours_plain` (neither); the check
  `recompiles_after_warmup` (`VARIED_CALLS`, after one warm-up pass over the same modes);
- `ours_no_overlap`: the same engine with overlap scheduling off, label `ours_no_overlap`;
  its model runner for host time;
- `sgl_jax_stock` / `sgl_jax_stock_no_overlap`: the engine as it ships (`sgl_jax_stock`);
- `tunix_sglang_jax`: tunix 0.1.7's own sgl-jax rollout (`tunix_sglang_jax`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sgl_jax_rollout.utils.compiles import count_compiles
from sgl_jax_rollout_apps.bench.workloads import prompts

# Ten calls that vary every sampling setting: (rollout config changes, per-call overrides).
VARIED_CALLS = [
    (dict(temperature=1.0), dict()),
    (dict(temperature=0.7, top_k=20), dict()),
    (dict(temperature=0.9, top_p=0.8), dict(min_p=0.05)),
    (dict(temperature=0.0), dict()),
    (dict(temperature=1.0), dict(repetition_penalty=1.3, frequency_penalty=0.5)),
    (dict(temperature=1.0), dict(presence_penalty=0.4, min_new_tokens=4)),
    (dict(temperature=1.0), dict(n=2, stop=["zz"])),
    (dict(temperature=1.0), dict(logprobs_mode="raw")),
    (dict(temperature=1.0), dict(entropy_source="processed", entropy_top_k=16)),
    (dict(temperature=1.0, seed=[3] * 16), dict(return_entropy=False)),
]
WORKERS = (
    "ours",
    "ours_no_overlap",
    "sgl_jax_stock",
    "sgl_jax_stock_no_overlap",
    "tunix_sglang_jax",
)


@dataclasses.dataclass
class Column:
    calls: dict[str, dict[str, Callable[[], Any]]]  # label -> workload -> one call
    runner: Any = None  # sgl-jax ModelRunner whose steps `engine.profiling.host_time` splits
    checks: dict[str, Callable[[], Any]] = dataclasses.field(default_factory=dict)
    shutdown: Callable[[], None] = lambda: None


def rollout_config(**changes: Any):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    base = dict(max_tokens_to_generate=64, max_prompt_length=64, temperature=1.0, top_p=1.0, seed=0)
    base.update(changes)
    return RolloutConfig(**base)


def build(worker: str, model_dir: Path, settings: dict, workloads: dict, plain: bool) -> Column:
    """`worker`'s column; `plain` adds `ours_plain` to the `ours` worker's."""
    if worker in ("ours", "ours_no_overlap"):
        overlap = worker == "ours"
        return _ours(model_dir, settings, workloads, overlap, plain=plain and overlap)
    if worker in ("sgl_jax_stock", "sgl_jax_stock_no_overlap"):
        from sgl_jax_rollout_apps.bench import sgl_jax_stock

        overlap = worker == "sgl_jax_stock"
        calls, runner = sgl_jax_stock.build(model_dir, settings, overlap, workloads)
        return Column({worker: calls}, runner=None if overlap else runner)
    if worker == "tunix_sglang_jax":
        from sgl_jax_rollout_apps.bench import tunix_sglang_jax

        return Column({worker: tunix_sglang_jax.build(model_dir, settings, workloads)})
    raise ValueError(f"unknown benchmark worker {worker!r}; one of {', '.join(WORKERS)}")


def _ours(model_dir: Path, settings: dict, workloads: dict, overlap: bool, plain: bool) -> Column:
    from sgl_jax_rollout.rollout import SglangJaxRollout

    rollout = SglangJaxRollout(
        model_path=model_dir, engine_settings=dict(settings, overlap_schedule=overlap)
    )
    full = "ours_full" if overlap else "ours_no_overlap"
    calls: dict[str, dict[str, Callable[[], Any]]] = {full: {}}
    if plain:
        calls["ours_plain"] = {}
    for name, (count, lengths, new_tokens) in workloads.items():
        batch = prompts(rollout.engine.tokenizer, count, lengths)
        generate = functools.partial(
            rollout.generate,
            batch,
            rollout_config(max_tokens_to_generate=new_tokens),
            ignore_eos=True,
        )
        calls[full][name] = generate
        if plain:
            calls["ours_plain"][name] = functools.partial(
                generate, return_logprobs=False, return_entropy=False
            )
    return Column(
        calls,
        runner=None if overlap else rollout.engine.model_runner,
        checks={"recompiles_after_warmup": functools.partial(recompiles, rollout)}
        if overlap
        else {},
        shutdown=rollout.shutdown,
    )


def recompiles(rollout) -> int:
    """Compiles in `VARIED_CALLS` (16 prompts, 16 new tokens), after one pass over the same
    modes with other values."""
    batch = prompts(rollout.engine.tokenizer, 16, (5, 40))

    def calls(shift: int):
        for changes, overrides in VARIED_CALLS:
            changes = dict(changes)
            if "temperature" in changes and changes["temperature"] > 0:
                changes["temperature"] = round(changes["temperature"] - 0.05 * shift, 3)
            changes.setdefault("seed", 100 + shift)
            rollout.generate(
                batch, rollout_config(max_tokens_to_generate=16, **changes), **overrides
            )

    calls(0)
    with count_compiles() as compiles:
        calls(1)
    return compiles.count
