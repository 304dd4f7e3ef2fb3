"""`check`'s exact reference for a float32 engine: the compared completions scored by tunix's own
model of the checkpoint computing in float64, so that a float32 gap above the tolerance says
which side is off.

Owns `ExactReference` (the float64 model, loaded once, given the trainer's current weights
before each scoring), `token_logps` and `logsumexp` (its log-softmax, in float64) and
`unavailable` (why it cannot run here). Engine and trainer each round in float32; their gap
is the two roundings added, so a gap above 1e-4 may be two sides each within it of exact
(measured on Gemma 3 270M at 1,000-token prompts, T = 0.7: engine 7.28e-5, trainer 7.76e-5
from the float64 model, 1.34e-4 between them).

The float64 model is tunix's, loaded with `dtype=float64` under `jax.enable_x64`: its matrix
products, residual adds and attention then compute in float64 except where tunix's code casts
to float32 on its own (its Qwen 2 / 3 and Llama 3 norms and softmax; its Gemma models have no
such cast). The log-softmax is taken here, in float64, from the model's logits (tunix's
`selective_log_softmax` takes it in float32). It runs in one process on a CPU or GPU backend
(TPUs have no float64 matrix unit) and holds a second copy of the weights, in float64: `check`
builds it only when a float32 row is above the tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def unavailable(lora: dict | None) -> str | None:
    """Why the exact reference cannot run here, or None."""
    import jax

    if jax.default_backend() == "tpu":
        return "a TPU has no float64 arithmetic"
    if jax.process_count() > 1:
        return f"it runs in one JAX process, not {jax.process_count()}"
    if lora:
        return "the float64 model carries no LoRA adapters"
    return None


def logsumexp(z: np.ndarray) -> np.ndarray:
    """`log(sum(exp(z)))` over the last axis, in float64, shifted by the max."""
    z = np.asarray(z, np.float64)
    top = z.max(-1, keepdims=True)
    return top[..., 0] + np.log(np.exp(z - top).sum(-1))


def token_logps(logits: np.ndarray, tokens: list, valid: int | None) -> np.ndarray:
    """Each completion token's log-softmax `[B, L]` in float64 from logits `[B, L, V]` (already
    divided by the temperature), over the first `valid` ids where given (the engine samples
    from those only); positions past a row's tokens are 0."""
    z = np.asarray(logits, np.float64)
    if valid is not None:
        z = z[..., :valid]
    normalizer = logsumexp(z)
    out = np.zeros(z.shape[:2])
    for i, row in enumerate(tokens):
        ids = np.asarray(row)[: z.shape[1]]
        out[i, : len(ids)] = z[i, np.arange(len(ids)), ids] - normalizer[i, : len(ids)]
    return out


class ExactReference:
    """tunix's model of `model_path` in float64, scoring rollout outputs with the weights the
    float32 trainer holds at the time (so a sync's perturbed weights are scored too)."""

    def __init__(self, model_path: str, trainer: Any, replay: bool) -> None:
        self._model_path = model_path
        self._trainer = trainer
        self._replay = replay
        self._model = None

    def logps(self, rollout, out, temperature: float, valid: int | None) -> np.ndarray:
        """The exact logprobs `[B, L]` of `out`'s completions at `temperature`."""
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from tunix_adapter.models import load_tunix_model
        from tunix_adapter.scoring import replays, trainer_scores

        with jax.enable_x64(True):
            if self._model is None:
                auto = (jax.sharding.AxisType.Auto,) * 2  # as `check.build`'s own mesh
                mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), auto, devices=jax.devices()[:1])
                self._model = load_tunix_model(self._model_path, mesh, jnp.float64)
                if self._replay:
                    replays(rollout, self._model)
            weights = nnx.state(self._trainer, nnx.Param)
            nnx.update(self._model, jax.tree.map(lambda x: x.astype(jnp.float64), weights))
            _, logits = trainer_scores(rollout, self._model, out, temperature, self._replay)
        return token_logps(logits, out.tokens, valid)
