"""What a README figure is, where a fresh run reports it, and when a fresh run has moved it.

Owns the three records of the figure check (`Source`: a command and how its output reads;
`Figure`: one number of the README, the source that measures it, the key it is read from and
its noise) and the two pure steps on them: `read_output` (a source's saved output -> a mapping
of keys to numbers) and `judge` (a figure against that mapping). Running the commands is
`runner.py`'s; the README's figures themselves are `registry.py`'s.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

Output = Literal["json", "table", "jsonl"]
Bound = Literal["both", "upper", "lower"]

# a `check` table row: label, two or more spaces, the value, two or more spaces, the limit
_TABLE_ROW = re.compile(r"^(?P<label>\S.*?)\s{2,}(?P<value>-?[\d.]+(?:e[-+]?\d+)?)\s{2,}\S")
_FIGURE = re.compile(r"\[(\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)\]")  # "[0.185] s": the figure


@dataclass(frozen=True)
class Source:
    """A command whose output holds figures, run once for all of them.

    `argv`: after `sgl-jax-rollout`; `{out}` is the run's scratch directory and `{model}` the
    path of `model` (`builtin`, or a `make-real-model` name), both filled in when it runs.
    `output`: `json` (a JSON object on the last stdout line that parses, or in `file`),
    `table` (`check`'s table on stdout, a row's label its key) or `jsonl` (`file`'s rows: keys
    `first.K` and `last.K`). `minutes`: about how long it takes on a 2-core CPU, so a run can
    leave the long ones out.
    """

    name: str
    argv: tuple[str, ...]
    output: Output
    minutes: float
    file: str | None = None
    model: str | None = None

    def command(self) -> str:
        return "sgl-jax-rollout " + " ".join(self.argv)


@dataclass(frozen=True)
class Figure:
    """One number of the README (its table's or its prose's) and how a fresh run gives it.
    `readme`: the README's words, the figure in brackets ("16 calls at once: [0.185] s"); the
    fresh value is `source`'s `key` (dotted for JSON), divided by `over`'s when set. `noise`:
    how far a fresh run may move it, relative to the figure; `floor`: in absolute units, for
    figures near 0. `bound`: `upper` for a bound a smaller value keeps (an error, a count of
    faults), `lower` for one a larger value keeps (an agreement share)."""

    readme: str
    source: str
    key: str
    noise: float
    floor: float = 0.0
    bound: Bound = "both"
    over: str | None = None

    @property
    def text(self) -> str:
        """The README's words, as written there."""
        return self.readme.replace("[", "").replace("]", "")

    @property
    def written(self) -> str:
        """The figure as the README writes it: the bracketed part of `readme`."""
        match = _FIGURE.search(self.readme)
        if match is None:
            raise ValueError(f"figure {self.readme!r}: bracket the number, as '[0.185] s'")
        return match.group(1)

    @property
    def value(self) -> float:
        return float(self.written.replace(",", ""))

    def allowed(self) -> str:
        spread = f"±{self.noise:.0%}" if self.noise else ""
        if self.floor:
            spread = f"{spread} or ±{self.floor:g}" if spread else f"±{self.floor:g}"
        side = {"both": "", "upper": "at most ", "lower": "at least "}[self.bound]
        return f"{side}{self.written} {spread}".strip()


def read_output(source: Source, stdout: str, file_text: str | None = None) -> dict[str, Any]:
    """The keys a source's output holds: its JSON object, its table's rows or its rows' first
    and last values. Raises ValueError naming the source when the output holds none."""
    if source.output == "table":
        rows = {}
        for line in stdout.splitlines():
            if match := _TABLE_ROW.match(line):
                rows[match.group("label").strip()] = float(match.group("value"))
        if not rows:
            raise ValueError(f"{source.name}: no table row in its output")
        return rows
    if source.output == "jsonl":
        records = [json.loads(line) for line in (file_text or "").splitlines() if line.strip()]
        if not records:
            raise ValueError(f"{source.name}: {source.file} holds no row")
        return {"first": records[0], "last": records[-1]}
    # a file is one JSON document; stdout's object is its last line that parses (progress first)
    texts = [file_text or ""] if source.file else reversed(stdout.strip().splitlines())
    for text in texts:
        try:
            found = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            continue
        if isinstance(found, dict):
            return found
    raise ValueError(f"{source.name}: no JSON object in its output")


def lookup(values: dict[str, Any], key: str) -> float:
    """`values[key]`, where a dotted key walks nested objects; a key that itself holds dots (a
    table row's label, `T=1.0`) is matched whole, the longest first."""
    node = _walk(values, key.split("."))
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise KeyError(f"{key} is {node!r}, not a number")
    return float(node)


def _walk(node: Any, parts: list[str]) -> Any:
    if not parts:
        return node
    if isinstance(node, dict):
        for split in range(len(parts), 0, -1):
            head = ".".join(parts[:split])
            if head in node:
                try:
                    return _walk(node[head], parts[split:])
                except KeyError:
                    continue
    raise KeyError(".".join(parts))


@dataclass(frozen=True)
class Verdict:
    figure: Figure
    measured: float | None
    ok: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "readme": self.figure.text,
            "figure": self.figure.written,
            "source": self.figure.source,
            "key": self.figure.key,
            "measured": self.measured,
            "allowed": self.figure.allowed(),
            "ok": self.ok,
            "why": self.why,
        }


def judge(figure: Figure, values: dict[str, Any]) -> Verdict:
    """Whether a fresh run's `values` keep `figure` within its noise."""
    try:
        measured = lookup(values, figure.key)
        if figure.over is not None:
            measured /= lookup(values, figure.over)
    except (KeyError, ZeroDivisionError) as err:
        return Verdict(figure, None, False, f"not in the output: {err}")
    if not math.isfinite(measured):
        return Verdict(figure, measured, False, "not finite")
    slack = max(figure.noise * abs(figure.value), figure.floor)
    high = measured > figure.value + slack and figure.bound != "lower"
    low = measured < figure.value - slack and figure.bound != "upper"
    if high or low:
        return Verdict(
            figure, measured, False, f"moved to {measured:.4g}, outside {figure.allowed()}"
        )
    return Verdict(figure, measured, True, "within its noise")
