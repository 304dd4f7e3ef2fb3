"""Forking tokens ("Beyond the 80/20 rule", Wang et al. 2025; TRL's `top_entropy_quantile`):
which completion tokens of a batch carry policy-gradient loss.

Owns `top_entropy_mask`: the tokens whose rollout entropy is at or above the `1 - rho` quantile
(linear interpolation, as `torch.quantile` / `numpy.quantile`) of every completion token's
entropy in the batch; `rho = 1` keeps every token. The entropy is the rollout's own (returned by
the engine with each token), so no trainer pass is needed for it.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float


def check_quantile(rho: float | None) -> None:
    if rho is not None and not (np.isfinite(rho) and 0.0 < rho <= 1.0):
        raise ValueError(f"top_entropy_quantile must be in (0, 1] (or None), got {rho}")


def top_entropy_mask(
    entropy: Float[np.ndarray, "b l"], completion_mask: Bool[np.ndarray, "b l"], rho: float
) -> tuple[Bool[np.ndarray, "b l"], float]:
    """(kept tokens, the entropy threshold): the top-`rho` completion tokens by entropy."""
    check_quantile(rho)
    mask = np.asarray(completion_mask, bool)
    values = np.asarray(entropy, np.float64)
    if not mask.any():
        return mask.copy(), float("nan")
    threshold = float(np.quantile(values[mask], 1.0 - rho))
    return mask & (values >= threshold), threshold
