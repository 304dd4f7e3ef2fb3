"""`sgl-jax-rollout bench lora`: how a bfloat16 engine's logprobs move under LoRA updates of
realistic size, against how the bfloat16 trainer's move (issue 83, point 3).

Owns `run`, `measure` and `moves`. `check`'s pair (tunix's trainer in the engine's dtype and
the engine on the same weights, `tunix_adapter.check.build`) gets rank-16 adapters (alpha 32,
the task demo's) with B at zero, as training starts them. The trainer then takes Adam steps at
the task demo's learning rate (`TASK_DEFAULTS`) on its own samples' logprobs (a likelihood
step on one set of completions, the update GRPO takes with all advantages positive), and after
`STEPS` (1, 10 and 100 steps) the adapters are synced into the engine (`update_params`, as
tunix syncs them) and three sides score another, held-out set of the engine's completions:

- the engine (`get_per_token_logps`, its own bfloat16 forward with the adapters it serves);
- the trainer (tunix's `compute_per_token_logps`, bfloat16);
- exact: the same bfloat16 weights and adapters in a float32 forward.

Each side's move is its logprobs now minus its logprobs with B at zero, token by token.
Reported per step count: the adapters' size (B's rms), the mean |move| of each side, the
correlation of the engine's move with the trainer's and with exact's, and the engine-trainer
gap. `ok`: at 10 steps the engine's move correlates >= `CORRELATION_TARGET` with the
trainer's (issue 83's target).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

STEPS = (1, 10, 100)
CORRELATION_TARGET = 0.8  # issue 83: the engine's move vs the trainer's, after 10 steps
TARGET_STEPS = 10
RANK = 16
PROMPTS = 8  # half trained on, half held out
PROMPT_TOKENS = 160
NEW_TOKENS = 32
SAMPLES = 4


def moves(base: dict[str, np.ndarray], now: dict[str, np.ndarray]) -> dict[str, float]:
    """How each side's flat logprobs moved from `base` to `now` (both `{"engine", "trainer",
    "exact"}` of one length): mean |move| per side, the engine's move's correlation with the
    trainer's and exact's, the trainer's with exact's, and the engine-trainer gap now."""
    move = {side: np.asarray(now[side], np.float64) - base[side] for side in now}
    gap = np.abs(np.asarray(now["engine"], np.float64) - now["trainer"])
    return {
        **{f"mean_abs_move_{side}": float(np.abs(m).mean()) for side, m in move.items()},
        "corr_engine_trainer": float(np.corrcoef(move["engine"], move["trainer"])[0, 1]),
        "corr_engine_exact": float(np.corrcoef(move["engine"], move["exact"])[0, 1]),
        "corr_trainer_exact": float(np.corrcoef(move["trainer"], move["exact"])[0, 1]),
        "gap_engine_trainer_max": float(gap.max()),
        "gap_engine_trainer_mean": float(gap.mean()),
    }


def run(model_dir: str | Path | None = None, numerics: str = "trainer") -> dict[str, Any]:
    """Builds the pair on `model_dir` (default: the built-in model), served in bfloat16 with
    `numerics`, and `measure`s it."""
    from sgl_jax_rollout.tiny_model import default_model_dir
    from tunix_adapter import check
    from tunix_adapter.check_config import CheckConfig

    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    config = CheckConfig(
        model_path=str(model_dir),
        lora_rank=RANK,
        prompts=PROMPTS,
        prompt_tokens=PROMPT_TOKENS,
        max_tokens=NEW_TOKENS,
        engine_settings={"dtype": "bfloat16", "numerics": numerics},
    )
    started = time.perf_counter()
    trainer, rollout, lora = check.build(config)
    try:
        rows = measure(config, trainer, rollout, lora)
    finally:
        rollout.shutdown()
    target = rows[f"after_{TARGET_STEPS}"]["corr_engine_trainer"]
    return {
        "model": str(model_dir),
        "numerics": numerics,
        "rank": RANK,
        "alpha": lora["alpha"],
        "learning_rate": _learning_rate(),
        **rows,
        "correlation_target": CORRELATION_TARGET,
        "wall_s": round(time.perf_counter() - started, 1),
        "ok": target >= CORRELATION_TARGET,
    }


def measure(config, trainer, rollout, lora) -> dict[str, Any]:
    """The rows of `run` on a built pair (`check.build` with `lora_rank`)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tunix_adapter.actor_lora import with_lora
    from tunix_adapter.check_config import rollout_config
    from tunix_adapter.check_prompts import long_prompts
    from tunix_adapter.models import load_tunix_model

    adapters = nnx.state(trainer, nnx.LoRAParam)
    nnx.update(trainer, _b_at_zero(adapters))  # check.build perturbs them
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    exact = with_lora(load_tunix_model(config.model_path, mesh, jnp.float32), lora, mesh)
    prompts = long_prompts(rollout.engine.tokenizer, config.prompts, config.prompt_tokens)
    sampling = rollout_config(config, 1.0)
    trained = _Rows(rollout, rollout.generate(prompts[0::2], sampling, n=SAMPLES))
    held_out = _Rows(rollout, rollout.generate(prompts[1::2], sampling, n=SAMPLES))
    step = _adam_step(trainer, rollout, optax.adam(_learning_rate()))

    def scores() -> dict[str, np.ndarray]:
        now = nnx.state(trainer, nnx.LoRAParam)
        nnx.update(exact, jax.tree_util.tree_map(lambda v: v.astype(jnp.float32), now))
        rollout.update_params(now, (nnx.LoRAParam,))
        return held_out.scores(rollout, trainer, exact)

    base = scores()
    rows: dict[str, Any] = {"held_out_tokens": int(base["engine"].size)}
    done = 0
    for target in STEPS:
        while done < target:
            loss = step(trained.prompts, trained.completions)
            done += 1
        row = moves(base, scores())
        rows[f"after_{done}"] = {
            "loss": float(loss),
            "b_rms": _b_rms(nnx.state(trainer, nnx.LoRAParam)),
            **row,
        }
        corr = row["corr_engine_trainer"]
        print(
            f"bench lora: after {done} steps, engine vs trainer move corr {corr:.3f}",
            file=sys.stderr,
            flush=True,
        )
    return rows


class _Rows:
    """One `generate` output as the left-padded prompts and right-padded completions tunix
    scores, and each completion's length before its pad."""

    def __init__(self, rollout, out):
        import jax.numpy as jnp

        from sgl_jax_rollout.rollout_inputs import right_pad_ids
        from tunix_adapter.scoring import before_pad

        pad = rollout.pad_id()
        self.out = out
        self.prompts = jnp.asarray(out.left_padded_prompt_tokens)
        width = max(len(t) for t in out.tokens)
        self.completions = jnp.asarray(right_pad_ids(out.tokens, width, pad))
        self.lengths = [before_pad(t, pad) for t in out.tokens]

    def flat(self, logps) -> np.ndarray:
        rows = np.asarray(logps, np.float64)
        return np.concatenate([rows[i, :n] for i, n in enumerate(self.lengths)])

    def scores(self, rollout, trainer, exact) -> dict[str, np.ndarray]:
        from tunix_adapter.scoring import trainer_logps

        return {
            "engine": self.flat(rollout.get_per_token_logps(self.prompts, self.completions)),
            "trainer": self.flat(trainer_logps(rollout, trainer, self.out, 1.0)),
            "exact": self.flat(trainer_logps(rollout, exact, self.out, 1.0)),
        }


def _adam_step(trainer, rollout, optimizer):
    """A jitted step of `optimizer` on the adapters, minimising the mean negative logprob of
    the given completions (tunix's `compute_per_token_logps`, pad positions masked)."""
    import jax.numpy as jnp
    from flax import nnx

    from sgl_jax_rollout import tunix_compat

    pad, eos = rollout.pad_id(), rollout.eos_id()
    state = nnx.Optimizer(trainer, optimizer, wrt=nnx.LoRAParam)

    @nnx.jit
    def step(model, state, prompts, completions):
        def loss(model):
            graph, params = nnx.split(model)
            logps = tunix_compat.compute_per_token_logps(
                graph, params, prompts, completions, pad_id=pad, eos_id=eos, stop_gradient=False
            )
            mask = (completions != pad).astype(jnp.float32)
            return -(logps.astype(jnp.float32) * mask).sum() / mask.sum()

        value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
        state.update(model, grads)
        return value

    return lambda prompts, completions: step(trainer, state, prompts, completions)


def _b_at_zero(adapters):
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map_with_path(
        lambda path, v: jnp.zeros_like(v) if "lora_b" in jax.tree_util.keystr(path) else v,
        adapters,
    )


def _b_rms(adapters) -> float:
    import jax

    b = [
        np.asarray(v, np.float64).ravel()
        for path, v in jax.tree_util.tree_leaves_with_path(adapters)
        if "lora_b" in jax.tree_util.keystr(path)
    ]
    return float(np.sqrt(np.mean(np.concatenate(b) ** 2)))


def _learning_rate() -> float:
    from sgl_jax_rollout_apps.demo_config import TASK_DEFAULTS

    return float(TASK_DEFAULTS["learning_rate"])
