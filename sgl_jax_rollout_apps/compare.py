"""`sgl-jax-rollout compare`: SglangJaxRollout side by side with a tunix rollout we trust.

Owns `CompareConfig` and `run`. On the same weights and prompts, for our rollout and the other
one (tunix's `VanillaRollout`, with entropy, or `VllmRollout` on TPU):

1. greedy agreement (identical completions, first diverging position);
2. logprob fidelity at temperature 1 and 0.7: each rollout's processed logprobs against tunix's
   trainer-side recomputation (`compute_per_token_logps`) on its own samples;
3. distribution agreement at temperature 1: per-position total variation between the two
   rollouts' token frequencies, next to the same statistic between two halves of our own
   samples (the noise floor at that sample size);
4. throughput (tokens/s, median of `runs` timed batches after a warm-up);
5. a short GRPO run with each (the demo's task, same seed): reward and entropy curves in one
   PNG, and the final rewards.

Writes `compare.json` and `compare.png` under `out`; returns the report. Statistics live in
`compare_stats.py`. One engine per process: our rollout is shut down before the GRPO runs,
which build their own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout_apps import compare_stats as stats
from sgl_jax_rollout_apps.plotting import require_matplotlib, training_curves
from tunix_adapter.scoring import before_pad, trainer_logps

log = logging.getLogger(__name__)
AGAINST = ("vanilla", "vllm")
FIDELITY_TEMPERATURES = (1.0, 0.7)


class CompareUnavailable(RuntimeError):
    """The requested comparison cannot run on this machine (the message says why)."""


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    against: str = "vanilla"
    model_path: str | None = None
    preset: str | None = None
    out: str = "compare_out"
    steps: int = 5  # GRPO steps per rollout
    prompts: int = 8
    max_tokens: int = 16
    tv_samples: int = 256  # samples per prompt for the distribution check
    tv_prompts: int = 2
    tv_positions: int = 4
    runs: int = 3
    seed: int = 0
    show_progress: bool = True
    # DemoConfig fields of the GRPO runs (off-policy correction, forking tokens), both rollouts
    grpo_variant: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.demo_config("sglang_jax")  # validates the GRPO variant before anything is built
        if self.against not in AGAINST:
            raise ValueError(f"against must be one of {AGAINST}, got {self.against!r}")
        for name in ("steps", "prompts", "max_tokens", "tv_prompts", "tv_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tv_samples < 16 or self.tv_samples % 2:
            raise ValueError(f"tv_samples must be an even number >= 16, got {self.tv_samples}")
        if self.runs < 3:
            raise ValueError(f"runs must be >= 3 (a median of timed runs), got {self.runs}")

    def demo_config(self, rollout: str):
        from sgl_jax_rollout_apps import demo

        return demo.DemoConfig(
            rollout=rollout,
            steps=self.steps,
            model_path=self.model_path,
            seed=self.seed,
            show_progress=self.show_progress,
            preset=self.preset,
            **self.grpo_variant,
        )


def check_available(config: CompareConfig) -> None:
    """Raises `CompareUnavailable` (before anything is built) when the other rollout or our
    engine cannot run here."""
    import importlib.util

    if config.against == "vllm":
        import jax

        if jax.default_backend() != "tpu":
            raise CompareUnavailable(
                "--against vllm needs a TPU with tunix's vLLM backend (vllm and tpu-inference "
                f"installed); this machine's JAX backend is {jax.default_backend()!r}. "
                "Use --against vanilla here."
            )
        if importlib.util.find_spec("vllm") is None:
            raise CompareUnavailable(
                "--against vllm needs vLLM with its TPU backend installed (see tunix's vLLM "
                "rollout setup); `import vllm` fails here"
            )
    from sgl_jax_rollout.engine.availability import require_sgl_jax

    try:
        require_sgl_jax()
        require_matplotlib()
    except ImportError as err:
        raise CompareUnavailable(str(err)) from None


def run(config: CompareConfig) -> dict[str, Any]:
    from sgl_jax_rollout_apps import demo

    check_available(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    ours, other, trainer, model_path = _build(config)
    prompts = demo.prompts(config.prompts, config.seed)
    report: dict[str, Any] = {
        "against": config.against,
        "model_path": str(model_path),
        "prompts": len(prompts),
        "max_tokens": config.max_tokens,
    }
    try:
        report["greedy"] = _greedy(config, ours, other, prompts)
        report["logprob_fidelity"] = {
            f"T={t}": {
                "sglang_jax": _fidelity(config, ours, trainer, prompts, t),
                config.against: _fidelity(config, other, trainer, prompts, t),
            }
            for t in FIDELITY_TEMPERATURES
        }
        report["distribution"] = _distribution(config, ours, other)
        report["throughput_tokens_per_s"] = {
            "sglang_jax": _throughput(config, ours, prompts),
            config.against: _throughput(config, other, prompts),
        }
    finally:
        ours.shutdown()
    report["grpo"] = _grpo(config, out)
    (out / "compare.json").write_text(json.dumps(report, indent=2))
    return report


def _build(config: CompareConfig):
    from transformers import AutoTokenizer

    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.tiny_model import default_model_dir
    from sgl_jax_rollout_apps.demo import DEMO_ENGINE_SETTINGS
    from tunix_adapter.models import load_tunix_model

    model_path = Path(config.model_path) if config.model_path else default_model_dir()
    settings: Any = DEMO_ENGINE_SETTINGS
    mesh = rollout_mesh = None
    if config.preset:
        import tpu_configs

        preset = tpu_configs.load(config.preset)
        preset.check_devices()
        preset.check_model(model_path)
        settings = preset.engine_settings()
        mesh, rollout_mesh = preset.meshes()
    trainer = load_tunix_model(model_path, mesh)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ours = SglangJaxRollout(model_path=model_path, engine_settings=settings, mesh=rollout_mesh)
    try:
        other = _other(config, trainer, tokenizer, mesh, model_path)
    except BaseException:
        ours.shutdown()
        raise
    return ours, other, trainer, model_path


def _other(config: CompareConfig, trainer, tokenizer, mesh, model_path: Path):
    if config.against == "vanilla":
        from tunix_adapter.vanilla import VanillaRolloutWithEntropy

        return VanillaRolloutWithEntropy(trainer, tokenizer, mesh, _config(config, 1.0))
    # tunix's own vLLM rollout setup (tunix/rl/rollout/vllm_rollout.py): the trainer's model
    # and mesh, the checkpoint directory as the vLLM model version. Runs only on TPU.
    from sgl_jax_rollout.tunix_compat import VllmRollout

    rollout_config = dataclasses.replace(
        _config(config, 1.0),
        rollout_vllm_model_version=str(model_path),
        rollout_vllm_hbm_utilization=0.3,
    )
    return VllmRollout(trainer, tokenizer, 4096, mesh, rollout_config)


def _config(config: CompareConfig, temperature: float | None, **changes: Any):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    fields = dict(
        max_tokens_to_generate=config.max_tokens,
        max_prompt_length=32,
        temperature=temperature if temperature is not None else 1.0,
        # top_p None makes tunix's vanilla sampler greedy; 1.0 keeps it sampling, unchanged
        top_p=None if temperature is None else 1.0,
        top_k=None,
        seed=config.seed,
        return_logprobs=True,
        kv_cache_size=256,
    )
    return RolloutConfig(**{**fields, **changes})


def _generate(rollout, prompts: list[str], rollout_config, greedy: bool = False):
    from sgl_jax_rollout.rollout import SglangJaxRollout

    if isinstance(rollout, SglangJaxRollout) and greedy:
        return rollout.generate(prompts, rollout_config, temperature=0.0)
    return rollout.generate(prompts, rollout_config)


def _greedy(config: CompareConfig, ours, other, prompts: list[str]) -> dict[str, Any]:
    """Completions compared through their first pad id: a pad ends ours (tunix's trainer reads
    every pad as padding), while tunix's samplers keep generating after it."""
    pad = ours.pad_id()
    a = _generate(ours, prompts, _config(config, None), greedy=True)
    b = _generate(other, prompts, _config(config, None), greedy=True)
    cut = [[row[: before_pad(row, pad) + 1] for row in _tokens(x)] for x in (a, b)]
    return {**stats.greedy_agreement(*cut), "compared_through": "the first pad id, inclusive"}


def _tokens(out) -> list[list[int]]:
    return [[int(t) for t in row] for row in out.tokens]


def _fidelity(config: CompareConfig, rollout, trainer, prompts, temperature: float) -> dict:
    return trainer_fidelity(rollout, trainer, prompts, _config(config, temperature))


def trainer_fidelity(rollout, trainer, prompts, rollout_config) -> dict:
    """Processed logprobs of the rollout's own samples vs tunix's trainer recomputation at the
    config's temperature, up to each sample's first pad id (tunix's trainer reads a pad as
    padding)."""
    out = rollout.generate(prompts, rollout_config)
    reference = trainer_logps(rollout, trainer, out, rollout_config.temperature)
    kept = [before_pad(row, rollout.pad_id()) for row in out.tokens]
    return stats.logprob_fidelity(
        [np.asarray(lp)[:k] for lp, k in zip(out.logprobs, kept, strict=True)],
        [reference[i, :k] for i, k in enumerate(kept)],
    )


def _distribution(config: CompareConfig, ours, other) -> dict[str, Any]:
    """Temperature 1, `tv_samples` samples of each of `tv_prompts` prompts per rollout; TV per
    position between our first half and theirs, and between our two halves (noise floor)."""
    from sgl_jax_rollout_apps import demo

    half = config.tv_samples // 2
    rows = []
    for prompt in demo.prompts(config.tv_prompts, config.seed + 1):
        batch = [prompt] * config.tv_samples
        rc = _config(config, 1.0, max_tokens_to_generate=config.tv_positions)
        a = _tokens(ours.generate(batch, rc))
        b = _tokens(other.generate(batch, rc))
        cross = stats.position_tv(a[:half], b[:half], config.tv_positions)
        null = stats.position_tv(a[:half], a[half:], config.tv_positions)
        rows.append(
            {
                "prompt": prompt,
                "samples_per_side": half,
                "tv_vs_other": cross["mean_tv"],
                "tv_ours_vs_ours": null["mean_tv"],
                "per_position": [
                    {**c, "tv_ours_vs_ours": n["tv"]}
                    for c, n in zip(cross["per_position"], null["per_position"], strict=False)
                ],
            }
        )
    return {
        "temperature": 1.0,
        "positions": config.tv_positions,
        "per_prompt": rows,
        "mean_tv_vs_other": float(np.mean([r["tv_vs_other"] for r in rows])),
        "mean_tv_ours_vs_ours": float(np.mean([r["tv_ours_vs_ours"] for r in rows])),
    }


def _throughput(config: CompareConfig, rollout, prompts: list[str]) -> float:
    rc = _config(config, 1.0)
    batch = prompts * 4
    rollout.generate(batch, rc)  # warm-up: compiles
    tokens, seconds = [], []
    for _ in range(config.runs):
        start = time.perf_counter()
        out = rollout.generate(batch, rc)
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(t) for t in out.tokens))
    return stats.median_throughput(tokens, seconds)


def _grpo(config: CompareConfig, out: Path) -> dict[str, Any]:
    from sgl_jax_rollout_apps import demo

    histories = {}
    rollouts = ("vanilla", "sglang_jax") if config.against == "vanilla" else ("sglang_jax",)
    for name in rollouts:
        demo_config = config.demo_config(name)
        cluster, learner = demo.build(demo_config)
        histories[name] = demo.train(demo_config, cluster, learner)
    training_curves(
        histories,
        out / "compare.png",
        f"GRPO{_variant_title(config.grpo_variant)}, same seed and reward: sglang_jax vs the "
        "other rollout",
    )
    return {
        "steps": config.steps,
        "variant": {k: v for k, v in config.grpo_variant.items() if v is not None},
        "final_reward": {k: h[-1]["reward_mean"] for k, h in histories.items()},
        "reward": {k: [r["reward_mean"] for r in h] for k, h in histories.items()},
        "entropy": {k: [r.get("entropy_mean", math.nan) for r in h] for k, h in histories.items()},
    }


def _variant_title(variant: dict[str, Any]) -> str:
    named = [f"{k}={v}" for k, v in variant.items() if v is not None]
    return f" ({', '.join(named)})" if named else ""


def table(report: dict[str, Any]) -> str:
    """The terminal summary of a report."""
    other = report["against"]
    g = report["greedy"]
    lines = [
        f"{'':34}{'sglang_jax':>14}{other:>14}",
        f"greedy agreement: {g['agreement']:.3f} over {report['prompts']} prompts; first "
        f"divergence: {g['first_divergence']}",
    ]
    for t, row in report["logprob_fidelity"].items():
        for stat, label in (("mean_abs_diff", "mean"), ("max_abs_diff", "max")):
            lines.append(
                f"{'logprob |diff| vs trainer ' + t + ' ' + label:34}"
                f"{row['sglang_jax'][stat]:>14.2e}{row[other][stat]:>14.2e}"
            )
    d = report["distribution"]
    n = d["per_prompt"][0]["samples_per_side"]
    lines.append(
        f"TV per position (T=1, {n} samples a side): vs {other} {d['mean_tv_vs_other']:.3f}, "
        f"ours vs ours {d['mean_tv_ours_vs_ours']:.3f}"
    )
    tp = report["throughput_tokens_per_s"]
    lines.append(f"{'throughput (tokens/s, median)':34}{tp['sglang_jax']:>14.1f}{tp[other]:>14.1f}")
    fr = report["grpo"]["final_reward"]
    lines.append(
        f"{'GRPO final reward (' + str(report['grpo']['steps']) + ' steps)':34}"
        f"{fr['sglang_jax']:>14.3f}{fr.get(other, math.nan):>14.3f}"
    )
    return "\n".join(lines)
