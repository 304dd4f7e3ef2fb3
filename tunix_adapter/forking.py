"""Forking tokens ("Beyond the 80/20 rule", Wang et al. 2025; TRL's `top_entropy_quantile`):
which completion tokens of a batch carry policy-gradient loss.

Owns `top_entropy_mask`: the tokens whose rollout entropy is at or above the `1 - rho` quantile
(linear interpolation, as `torch.quantile` / `numpy.quantile`) of every completion token's
entropy in the global batch; `rho = 1` keeps every token. With one JAX process per host the
quantile is taken over every process's tokens (TRL gathers them across ranks first,
`GRPOTrainer.get_high_entropy_mask`), so a pod keeps the tokens one process would. The entropy
is the rollout's own (returned by the engine with each token), so no trainer pass is needed.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float

from tunix_adapter.process_batch import all_values


def check_quantile(rho: float | None) -> None:
    if rho is not None and not (np.isfinite(rho) and 0.0 < rho <= 1.0):
        raise ValueError(f"top_entropy_quantile must be in (0, 1] (or None), got {rho}")


def top_entropy_mask(
    entropy: Float[np.ndarray, "b l"], completion_mask: Bool[np.ndarray, "b l"], rho: float
) -> tuple[Bool[np.ndarray, "b l"], float]:
    """(kept tokens, the entropy threshold): the top-`rho` completion tokens by entropy, the
    threshold taken over every process's completion tokens (each process calls it at once)."""
    check_quantile(rho)
    mask = np.asarray(completion_mask, bool)
    values = np.asarray(entropy, np.float32)  # the rollout's precision, as processes exchange it
    batch = all_values(values[mask]).astype(np.float64)
    if not batch.size:
        return mask.copy(), float("nan")
    threshold = float(np.quantile(batch, 1.0 - rho))
    return mask & (values.astype(np.float64) >= threshold), threshold
