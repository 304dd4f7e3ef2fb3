"""`sgl-jax-rollout bench rollout` and `bench weights`: rollout throughput and weight sync.

Owns both benchmarks (CLI subcommands; not imported by the library).

`rollout`: for each workload of `workloads.WORKLOADS` (16 prompts of 5..40 tokens and 64
prompts of 16 tokens, 64 new tokens each, temperature 1, EOS ignored so every backend makes
the same number of tokens), tokens/s as the median of >= 5 runs after a warm-up call, for
- `ours_full`: `SglangJaxRollout` returning logprobs and full-vocabulary entropy, with its
  defaults (overlap scheduling on; also reported as `ours_overlap`, the same measurement);
- `ours_no_overlap`: the same on an engine of its own with overlap scheduling off;
- `ours_plain`: the rollout with neither logprobs nor entropy (overlap on);
- `tunix_sglang_jax`: tunix 0.1.7's own sgl-jax rollout with tunix's defaults (overlap
  scheduling on), same engine settings and weights;
- `sgl_jax_stock` / `sgl_jax_stock_no_overlap`: the engine as it ships (its own sampler, no
  logprobs, no entropy) with overlap scheduling on / off;
- `vanilla`: tunix's `VanillaRollout` on the trainer model with the same weights (in this
  process, before the others).
Every engine column runs on an engine of its own in a process of its own (`columns`), all
started first and then timed in turns (`turns`): in each run every column makes one call, in
an order rotated from run to run, so a drift in the machine's speed reaches all alike; the
runs are spread over `starts` starts of every engine (`STARTS`), whose speeds differ. Off TPU
our columns run our paged attention and `tunix_sglang_jax` / `sgl_jax_stock` sgl-jax's native
one (each engine as its user gets it), so their tokens/s differ mostly by the attention there;
the host and sampler milliseconds compare the parts a TPU, where all run one kernel, keeps.
Plus `ratios`, `recompiles_after_warmup` (10 calls that vary every sampling setting, after one
warm-up pass over the same 10 modes) and `host_ms_per_decode_step`: engine wall time per
model step minus the time in the jitted model and sampler calls (`engine.profiling`), ours
and the stock engine's, both with overlap off (`HOST_COLUMNS`: with it on the host's work
hides behind the device's, and wall minus device time no longer measures it), with the
sampler's milliseconds per step beside it (`host_time`), timed in turns too. `penalties_host`:
our host milliseconds per decode step with penalties on (`PENALTY_OVERRIDES`) at
`PENALTY_LENGTHS` generated tokens, and their ratio: host work that grows with the length of a
generation shows there (an engine of its own in this process, `PENALTY_SETTINGS`, overlap
off). `real_size`: the same columns (ours full with overlap on / off, stock with overlap on /
off, host times) for a second model with Qwen3-0.6B's dimensions and vocabulary and
`REAL_SIZE_LAYERS` layers (`real_size_layers`; 0 skips it), generated offline on first use,
where the model step and the 151,936-id sampler weigh what they weigh on a slice.
`moe_routed_experts`: decode tokens/s of the Qwen3-MoE replica with `return_routed_experts` off
and on, and the cost in percent (`replay_bench.cost`, two engines in this process).

`weights`: `update_params` with the trainer's nnx state (mapped, resharded, checked, swapped,
cache flushed) against a plain `jax.device_put` copy of the same pytree: median of >= 5,
`ratios.update_vs_device_put`, and compiles counted from the second call on. Also the LoRA
sync tunix makes with adapters on the actor (rank `LORA_RANK` on every projection): only the
`nnx.LoRAParam` state, merged into the frozen base on the way in (`lora_update_ms`,
`ratios.lora_vs_full_update`). `cross_host`: one sync from a trainer spanning two simulated
hosts to each host's engine devices, bytes from the compiled program (`cross_host_weights.py`,
under `sgl-jax-rollout launch`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from sgl_jax_rollout.utils.compiles import count_compiles
from sgl_jax_rollout_apps.bench import replay_bench
from sgl_jax_rollout_apps.bench.columns import WORKERS, rollout_config
from sgl_jax_rollout_apps.bench.turns import measure
from sgl_jax_rollout_apps.bench.workloads import WORKLOADS, prompts

LORA_RANK = 8
STARTS = 3  # engine starts per column, the runs spread over them (`turns.measure`)
SETTINGS = dict(
    context_length=512,
    max_running_requests=64,
    precompile_bs_paddings=(1, 4, 16, 64),
    precompile_token_paddings=(256, 1024, 4096),
    max_prefill_tokens=4096,
    # Enough for 64 x (16 + 64) tokens. On CPU the attention cost grows with the KV pool
    # (32768 tokens: 64 ms per decode step at batch 16; 8192: 37 ms) and with the context
    # length (1024: about 2.5x the step of 512).
    max_total_tokens=8192,
    page_size=1,
    disable_radix_cache=False,
)

PENALTY_PROMPTS = (8, (5, 40))  # count, (min, max) prompt tokens
PENALTY_LENGTHS = (64, 512)
PENALTY_OVERRIDES = dict(repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1)
# An engine of its own: 40 + 512 tokens need a longer context than the throughput workloads.
PENALTY_SETTINGS = dict(
    SETTINGS,
    context_length=1024,
    max_running_requests=8,
    precompile_bs_paddings=(8,),
    precompile_token_paddings=(512,),
)

# The second model size: Qwen3-0.6B's dimensions and vocabulary (`real_size_model_dir`), few
# layers so a 2-core run finishes in minutes; its model step and sampler (151,936 ids) dominate.
REAL_SIZE_LAYERS = 2
REAL_SIZE_WORKLOADS = {"8x32_varied": (8, (5, 40), 32)}
REAL_SIZE_SETTINGS = dict(
    SETTINGS,
    max_running_requests=8,
    precompile_bs_paddings=(8,),
    precompile_token_paddings=(512,),
)

TINY_WORKERS = list(WORKERS)
REAL_SIZE_WORKERS = [w for w in WORKERS if w != "tunix_sglang_jax"]
# Host time is measured with overlap scheduling off (with it on, host work hides behind the
# device's and wall minus device time no longer measures it): label measured -> name shown.
HOST_COLUMNS = {"ours_no_overlap": "ours", "sgl_jax_stock_no_overlap": "sgl_jax_stock"}
LABELS = [
    *("ours_full", "ours_plain", "ours_overlap", "ours_no_overlap", "sgl_jax_stock"),
    *("sgl_jax_stock_no_overlap", "tunix_sglang_jax", "vanilla"),
]


def _median_rate(call, tokens: int, runs: int, label: str) -> float:
    call()  # warm-up
    rates = []
    for _ in tqdm(range(runs), desc=label, leave=False, file=sys.stderr):
        start = time.perf_counter()
        call()
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def run_rollout(
    model_dir: str | Path | None = None,
    runs: int = 5,
    real_size_layers: int = REAL_SIZE_LAYERS,
    starts: int = STARTS,
) -> dict:
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.tiny_model import default_model_dir

    model_dir = Path(model_dir) if model_dir else default_model_dir()
    result: dict[str, Any] = {
        "model": str(model_dir),
        "device": jax.default_backend(),
        "runs": runs,
        "engine_starts": starts,
        "engine_settings": SETTINGS,
    }
    vanilla = _vanilla_rates(model_dir, runs)
    checks = {"ours": ["recompiles_after_warmup"]}
    tiny = measure(TINY_WORKERS, model_dir, SETTINGS, WORKLOADS, runs, starts, True, checks)
    result["recompiles_after_warmup"] = tiny.checks["ours"]["recompiles_after_warmup"]
    for name, rate in vanilla.items():
        tiny.rates[name]["vanilla"] = rate
    result.update(_columns(tiny.rates, tiny.host))
    rollout = SglangJaxRollout(
        model_path=model_dir, engine_settings=dict(PENALTY_SETTINGS, overlap_schedule=False)
    )
    try:
        result["penalties_host"] = _penalties_host(rollout, rollout.engine.tokenizer, runs)
    finally:
        rollout.shutdown()
    if real_size_layers:
        result["real_size"] = _real_size(real_size_layers, runs, starts)
    # The routed-experts column: decode tokens/s of the Qwen3-MoE replica with
    # `return_routed_experts` off and on (bench replay measures the same, with fidelity).
    result["moe_routed_experts"] = replay_bench.cost(runs)
    return result


def _columns(rates: dict[str, dict[str, float]], host: dict[str, dict[str, dict]]) -> dict:
    """`tokens_per_s`, `host_time`, `host_ms_per_decode_step` and `ratios` of one model from
    the measured rates (workload -> label -> tokens/s) and host times (workload -> label
    measured, as in `HOST_COLUMNS`, -> figures). `ours_overlap` is `ours_full` (our default);
    a host time not measured is None."""
    table, host_time, ratios = {}, {}, {}
    for name, measured in rates.items():
        measured = dict(measured, ours_overlap=measured["ours_full"])
        table[name] = r = {label: measured[label] for label in LABELS if label in measured}
        ratios[name] = {
            f"full_vs_{other.removeprefix('ours_')}": r["ours_full"] / r[other]
            for other in r
            if other not in ("ours_full", "ours_overlap") and not other.endswith("no_overlap")
        }
        if "ours_no_overlap" in r:
            ratios[name]["overlap_vs_no_overlap"] = r["ours_overlap"] / r["ours_no_overlap"]
        host_time[name] = {
            shown: host.get(name, {}).get(label) for label, shown in HOST_COLUMNS.items()
        }
    return {
        "tokens_per_s": table,
        "host_time": host_time,
        "host_ms_per_decode_step": {
            name: {shown: (v or {}).get("host_ms_per_decode_step") for shown, v in h.items()}
            for name, h in host_time.items()
        },
        "ratios": ratios,
    }


def _real_size(layers: int, runs: int, starts: int) -> dict[str, Any]:
    """The second model size (`REAL_SIZE_*`): ours (full) against the stock engine."""
    from sgl_jax_rollout.tiny_model import real_size_model_dir

    model_dir = real_size_model_dir(layers)
    real = measure(
        REAL_SIZE_WORKERS, model_dir, REAL_SIZE_SETTINGS, REAL_SIZE_WORKLOADS, runs, starts
    )
    return {
        "model": str(model_dir),
        "layers": layers,
        "engine_settings": REAL_SIZE_SETTINGS,
        **_columns(real.rates, real.host),
    }


def _penalties_host(rollout, tokenizer, runs: int) -> dict[str, Any]:
    """Our host time per step with penalties on, at each of `PENALTY_LENGTHS` new tokens."""
    from sgl_jax_rollout.engine.profiling import host_time

    batch = prompts(tokenizer, *PENALTY_PROMPTS)
    out: dict[str, Any] = {"prompts": PENALTY_PROMPTS[0], "overrides": PENALTY_OVERRIDES}
    for length in PENALTY_LENGTHS:
        rc = rollout_config(max_tokens_to_generate=length)

        def call(rc=rc):
            rollout.generate(batch, rc, ignore_eos=True, **PENALTY_OVERRIDES)

        call()  # warm-up: compiles every id-table width bucket this length meets
        out[str(length)] = host_time(rollout.engine.model_runner, call, runs)
    short, long = (out[str(n)]["host_ms_per_decode_step"] for n in PENALTY_LENGTHS)
    out[f"host_{PENALTY_LENGTHS[1]}_vs_{PENALTY_LENGTHS[0]}"] = long / short
    return out


def _vanilla_rates(model_dir: Path, runs: int) -> dict[str, float]:
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tunix_compat import CacheConfig, VanillaRollout
    from tunix_adapter.models import load_tunix_model

    model = load_tunix_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cfg = model.config
    vanilla = VanillaRollout(
        model,
        tokenizer,
        CacheConfig(
            cache_size=256,
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
        ),
    )
    rates = {}
    for name, (count, lengths, new_tokens) in WORKLOADS.items():
        batch = prompts(tokenizer, count, lengths)
        rc = rollout_config(max_tokens_to_generate=new_tokens, eos_tokens=[-1])
        rates[name] = _median_rate(
            lambda b=batch, c=rc: vanilla.generate(b, c),
            count * new_tokens,
            runs,
            f"vanilla {name}",
        )
    return rates


def run_weights(model_dir: str | Path | None = None, runs: int = 5) -> dict:
    from flax import nnx

    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.tiny_model import default_model_dir
    from tunix_adapter.cluster import lora_scaling, with_lora
    from tunix_adapter.models import load_tunix_model

    model_dir = Path(model_dir) if model_dir else default_model_dir()
    trainer = load_tunix_model(model_dir)
    state = nnx.state(trainer, nnx.Param)
    lora = {"rank": LORA_RANK, "alpha": 2.0 * LORA_RANK}
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    actor = with_lora(load_tunix_model(model_dir, mesh), lora, mesh)
    adapters = nnx.state(actor, nnx.LoRAParam)
    rollout = SglangJaxRollout(
        rollout_actor=actor,
        model_path=model_dir,
        engine_settings=dict(SETTINGS, precompile_bs_paddings=(1, 4, 16, 64)),
        lora_scaling=lora_scaling(lora),
    )

    def timed(label: str, call) -> tuple[list[float], int]:
        """Seconds per call after the first (which compiles the mapping program), and the
        compiles seen in those calls."""
        call()
        seconds = []
        with count_compiles() as compiles:
            for _ in tqdm(range(runs), desc=label, leave=False, file=sys.stderr):
                start = time.perf_counter()
                call()
                seconds.append(time.perf_counter() - start)
        return seconds, compiles.count

    try:
        update, full_compiles = timed("update_params", lambda: rollout.update_params(state))
        lora_update, lora_compiles = timed(
            "update_params (LoRA)", lambda: rollout.update_params(adapters, (nnx.LoRAParam,))
        )
        put = []
        for _ in range(runs + 1):
            start = time.perf_counter()
            jax.block_until_ready(jax.device_put(state, may_alias=False))
            put.append(time.perf_counter() - start)
        put = put[1:]
    finally:
        rollout.shutdown()
    params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state))
    cross_host = _cross_host_weights(model_dir, runs)
    return {
        "model": str(model_dir),
        "device": jax.default_backend(),
        "parameters": params,
        "runs": runs,
        "lora_parameters": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(adapters)),
        "update_params_ms": 1e3 * statistics.median(update),
        "lora_update_ms": 1e3 * statistics.median(lora_update),
        "device_put_ms": 1e3 * statistics.median(put),
        "ratios": {
            "update_vs_device_put": statistics.median(update) / statistics.median(put),
            "lora_vs_full_update": statistics.median(lora_update) / statistics.median(update),
        },
        "recompiles_after_first_call": full_compiles + lora_compiles,
        "cross_host": cross_host,
    }


def _cross_host_weights(model_dir: Path, runs: int) -> dict:
    """`cross_host_weights.py`'s measurement: two simulated hosts of 4 CPU devices each."""
    print("bench weights: cross_host section (2 processes x 4 devices)", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "sgl_jax_rollout_apps.cli", "launch", "--processes", "2"]
        + ["--devices-per-process", "4", "--timeout", "600", "--", sys.executable, "-m"]
        + ["sgl_jax_rollout_apps.bench.cross_host_weights", str(model_dir), str(runs)],
        capture_output=True,
        text=True,
        timeout=700,
    )
    for line in done.stdout.splitlines():
        if line.startswith("[p0] RESULT "):
            return json.loads(line[len("[p0] RESULT ") :])
    raise RuntimeError(
        f"bench weights: the cross_host measurement failed (exit {done.returncode}):\n"
        + done.stdout[-3000:]
        + done.stderr[-3000:]
    )
