"""`sgl-jax-rollout check`: the pre-flight to run before spending a TPU-day on a checkpoint.

Owns `run`: it loads the trainer model (tunix, as training will, computing in the engine's
dtype unless `trainer_dtype` says otherwise: a bfloat16 engine is checked against tunix's
bfloat16 trainer) and the engine on the same weights, says how each rounds, then checks
(`check_verdicts.py`), on prompts long enough that positions pass `prompt_tokens` (RoPE
differences grow with position), of different lengths (so the batch the trainer scores is
left-padded as in training), each sampled `samples` times (a group, whose copies share one
prefill, as GRPO's do):

1. greedy: the engine's greedy tokens are the trainer's argmax at every position (a bfloat16
   engine: at 90% of them, a token whose trainer logprob is within the bfloat16 tolerance of
   the argmax's counting as agreeing: such near-ties are decided by rounding);
2. logprob fidelity at temperature 1 and 0.7: the engine's processed logprobs of its own
   samples against tunix's trainer-side `compute_per_token_logps`. Where the model's
   vocabulary is longer than its tokenizer, the engine never samples the ids past it and its
   logprobs are over the tokenizer's ids: the trainer's are renormalised the same way here,
   and one more row gives what that renormalisation adds at worst (`-log(1 - m)`, `m` the
   trainer's mass on those ids), a gap between rollout and trainer logprobs in training that
   no engine fix closes (tiny on a trained checkpoint; large on random weights whose tokenizer
   is a fraction of the vocabulary, as the Qwen3-0.6B-size benchmark model's);
   Beside them, reported and not judged: the mean gap at temperature 1, and the floor, the
   trainer against itself on the same rows with 64 more pad columns (same tokens, same
   positions, another batch layout): the spread no implementation beats without
   batch-invariant kernels on both sides (in bfloat16 the engine's largest gap at T is
   judged against twice the floor's divided by T, or the bfloat16 tolerance where larger);
3. weight sync: after `update_params` with perturbed trainer weights (or perturbed LoRA
   adapters, as tunix syncs them), fidelity at temperature 1 again;
4. alignment: one logprob and one entropy per token, a stop (EOS) token only at the end,
   no pad id inside a completion, and pad id != EOS id;
5. with `--lora-rank`, the update the engine serves from small adapters (B ~ N(0, 1e-5), where
   most of `s * A @ B` is below half a bfloat16 step of `W`, so a merge rounded to a
   bfloat16 engine would drop it): the engine's effective `s * A @ B` per adapted module, read
   from its own weights, against the trainer's in float64 (relative error over all modules);
6. the pad id inside prompts: none of the tested prompts holds the pad id the rollout hands
   tunix (tunix would mask it as padding). Where the tokenizer has a chat template, the
   prompts are chat conversations (a system turn, an exchange, then the long user turn), so
   every turn-closing token is in them; where a prompt holds the pad, the row fails naming
   the id and no other check runs;
7. on a mixture of experts, the engine returns its routed experts and the trainer scores with
   them (routing replay, as training with `routing_replay=True` does): in bfloat16, rounding
   sends some tokens to another expert (the eighth and ninth of Qwen3-MoE's router are often
   close), which no tolerance meant for rounding covers. One more row gives the share of
   positions the trainer routes otherwise without replay (the largest layer's): 0 in float32,
   where a flip means a fault; reported, not judged, in bfloat16.

Each check gives one row with the measured value, its limit and a verdict; any failed row makes
the command exit non-zero. The float32 tolerance is 1e-4; a bfloat16 engine gets 0.1, or
twice the measured floor over T where that is larger (rounding, not a bug, dominates there:
see docs/guide.md, "bfloat16"). Where a float32 logprob row is above 1e-4, its completions are
scored again by tunix's model of the checkpoint computing in float64 (`check_exact.py`; on a
CPU or GPU, without LoRA): two more rows give each side's largest distance to it, the
engine's judged against 1e-4, the trainer's reported, and the row's own limit becomes 1e-4
plus the trainer's distance (an engine within 1e-4 of exact is within that of the trainer):
two float32 roundings each within the tolerance pass, an engine off by more fails.

The settings are `CheckConfig` (`check_config.py`), the prompts `check_prompts.py`, the exact
reference `check_exact.py`, the perturbed weights and the LoRA measure `check_weights.py`, the
rows and their table `check_table.py`; their public names stay importable from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from sgl_jax_rollout.engine import numerics, rope_phases
from tunix_adapter.check_config import CheckConfig, room
from tunix_adapter.check_prompts import CHAT_OPENING, SENTENCE
from tunix_adapter.check_table import Verdict, table
from tunix_adapter.check_verdicts import (
    BF16_TOLERANCE,
    F32_TOLERANCE,
    engine_dtype,
    pad_in_prompts,
    trainer_dtype,
    verdicts,
)
from tunix_adapter.check_weights import lora_update_error, perturbed, small_adapters

__all__ = [
    "BF16_TOLERANCE",
    "CHAT_OPENING",
    "F32_TOLERANCE",
    "SENTENCE",
    "CheckConfig",
    "Verdict",
    "build",
    "lora_update_error",
    "pad_in_prompts",
    "perturbed",
    "run",
    "small_adapters",
    "table",
    "verdicts",
]

log = logging.getLogger(__name__)


def run(config: CheckConfig, progress: Callable[[str], None] | None = None) -> list[Verdict]:
    """Builds trainer and engine for `config.model_path`, runs every check, shuts down.
    `progress` gets a line as each stage starts (the CLI prints them)."""
    say = progress or (lambda line: None)
    started = time.perf_counter()
    say(f"loading the trainer model and starting the engine for {config.model_path}")
    trainer, rollout, lora = build(config)
    say(f"ready after {time.perf_counter() - started:.0f} s")
    engine = rollout.engine
    say(f"RoPE phases: {rope_phases.described(engine.model_type, engine.settings.rope_phases)}")
    served = engine_dtype(rollout)
    cast = ", its logits cast to float32" if config.trainer_logits_dtype else ""
    say(f"the trainer computes in {trainer_dtype(trainer)}{cast}, the engine in {served}")
    if served != "float32":
        say(f"rounding: {numerics.described(engine.model_type, engine.settings.numerics)}")
    try:
        return verdicts(config, rollout, trainer, lora, progress)
    finally:
        rollout.shutdown()


def build(config: CheckConfig):
    """(trainer, rollout, lora spec or None) on the preset's meshes, or one device: the pair
    `run` checks (also `bench lora`'s)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout.engine.settings import EngineSettings, resolved_dtype
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from sgl_jax_rollout.utils.model_dir import read_config
    from tunix_adapter import routing_replay
    from tunix_adapter.actor_lora import lora_scaling, with_lora
    from tunix_adapter.models import load_tunix_model

    model_path = _model_dir(config)
    context, prefill, batch = room(config)
    rollout_mesh = None
    if config.preset:
        import tpu_configs

        preset = tpu_configs.load(config.preset)
        preset.check_devices()
        preset.check_model(model_path)
        mesh, rollout_mesh = preset.meshes()
        settings = preset.engine_settings()
        settings = settings.replace(context_length=max(settings.context_length, context))
    else:
        mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        settings = EngineSettings(
            context_length=context,
            max_prefill_tokens=prefill,
            precompile_token_paddings=(prefill,),
            max_running_requests=batch,
            precompile_bs_paddings=(batch,),
            max_total_tokens=4 * prefill,
        )
    dtype = dict(config.engine_settings or {}).get("dtype", settings.dtype)
    served = resolved_dtype(dtype, read_config(model_path))
    trainer = load_tunix_model(
        model_path,
        mesh,
        jnp.dtype(config.trainer_dtype or served),
        logits_dtype=config.trainer_logits_dtype,
    )
    if routing_replay.moe_layers(trainer):  # the trainer scores with the rollout's experts
        settings = settings.replace(return_routed_experts=True)
    settings = settings.replace(**dict(config.engine_settings or {}))
    lora = None
    if config.lora_rank:
        lora = {"rank": config.lora_rank, "alpha": 2.0 * config.lora_rank, "seed": config.seed}
        trainer = with_lora(trainer, lora, mesh)
        # Trained-looking adapters (B starts at zero, which would make any merge look right).
        adapters = nnx.state(trainer, nnx.LoRAParam)
        nnx.update(trainer, perturbed(adapters, scale=0.05, seed=config.seed))
    rollout = SglangJaxRollout(
        rollout_actor=trainer,
        mesh=rollout_mesh,
        model_path=model_path,
        engine_settings=settings,
        lora_scaling=lora_scaling(lora),
    )
    return trainer, rollout, lora


def _model_dir(config: CheckConfig) -> Path:
    path = Path(config.model_path)
    if not (path / "config.json").is_file():
        raise ValueError(f"--model-path must be a model directory with config.json: {path}")
    return path
