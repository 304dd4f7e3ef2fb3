"""The checks a call's inputs pass before any of its requests reaches the engine.

Owns `checked_ids` (token ids in the vocabulary) and `checked_groups` (`generate`'s groups and
`need_groups`), each raising ValueError naming the row, the position and the allowed range.
Pure: no engine state, no sgl_jax import; a refused call touches no other call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def checked_ids(ids: Sequence[int], vocab_size: int, what: str) -> list[int]:
    """Token ids as ints in [0, vocab_size), or ValueError naming the row and position."""
    out = []
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int | np.integer):
            raise ValueError(f"{what}: token {j} must be an integer id, got {t!r}")
        if not 0 <= t < vocab_size:
            raise ValueError(
                f"{what}: token {j} is {int(t)}, outside the vocabulary [0, {vocab_size})"
            )
        out.append(int(t))
    return out


def checked_groups(groups: Sequence[int] | None, need: int | None, rows: int) -> None:
    """`generate`'s `groups` / `need_groups`: both or neither, one group per row, need in
    [1, distinct groups]."""
    if groups is None and need is None:
        return
    if groups is None or need is None:
        raise ValueError("groups and need_groups go together: set both or neither")
    if len(groups) != rows:
        raise ValueError(f"groups has {len(groups)} entries for {rows} prompts: one per prompt")
    distinct = len(set(groups))
    if isinstance(need, bool) or not isinstance(need, int) or not 1 <= need <= distinct:
        raise ValueError(f"need_groups must be an integer in [1, {distinct}], got {need!r}")
