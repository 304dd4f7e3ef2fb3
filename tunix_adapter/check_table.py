"""The pre-flight's rows: `Verdict` (one check's value, limit and verdict) and `table`.

Owns how `sgl-jax-rollout check` prints its result; it must not compute any check
(`check_verdicts.py` does).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Verdict:
    check: str
    value: float
    limit: str
    ok: bool

    def row(self) -> str:
        return (
            f"{self.check:<54} {self.value:>10.3g}  {self.limit:<10} {'ok' if self.ok else 'FAIL'}"
        )


def table(rows: list[Verdict]) -> str:
    header = f"{'check':<54} {'value':>10}  {'limit':<10} verdict"
    return "\n".join([header, *(r.row() for r in rows)])
