"""Runs the README's figure check: each chosen source's command once, in a process of its own,
its output saved under the run's directory, then every figure it measures judged.

`check_figures` is the whole run; `saved=True` judges the outputs a former run left in `out`
without running anything (the same verdicts, in seconds). A source whose command fails, or
whose output lacks a figure's key, fails its figures by name; a source left out (over
`max_minutes`, not asked for) is reported as such and fails nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sgl_jax_rollout_apps.figures.registry import SOURCES, figures_of
from sgl_jax_rollout_apps.figures.spec import Source, Verdict, judge, read_output

Progress = Callable[[str], None]
STDOUT = "stdout.txt"
STDERR = "stderr.txt"


def slug(source: Source) -> str:
    return "-".join(source.name.replace("/", " ").split())


def choose(
    only: Sequence[str] = (), max_minutes: float | None = None
) -> tuple[list[Source], dict[str, str]]:
    """The sources to run, in the registry's order, and why each other one is left out.
    Raises ValueError naming an unknown source."""
    known = {source.name for source in SOURCES}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(f"unknown source(s) {unknown}: one of {sorted(known)}")
    chosen, left_out = [], {}
    for source in SOURCES:
        if only and source.name not in only:
            left_out[source.name] = "not asked for"
        elif not only and max_minutes is not None and source.minutes > max_minutes:
            left_out[source.name] = (
                f"about {source.minutes:g} min, over --max-minutes {max_minutes:g}"
            )
        else:
            chosen.append(source)
    return chosen, left_out


def _model_path(model: str) -> Path:
    if model == "builtin":
        from sgl_jax_rollout.tiny_model import default_model_dir

        return default_model_dir()
    from sgl_jax_rollout_apps.real_model import real_model_dir

    return real_model_dir(model=model)


def run_source(source: Source, out: Path, progress: Progress) -> dict[str, Any]:
    """Runs `source`'s command with its stdout and stderr in `out` (created); its rc and wall."""
    out.mkdir(parents=True, exist_ok=True)
    fill = {"out": str(out)}
    if source.model is not None:
        fill["model"] = str(_model_path(source.model))
    argv = [part.format(**fill) for part in source.argv]
    command = " ".join(["sgl-jax-rollout", *argv])
    progress(f"{command} (about {source.minutes:g} min; its log: {out / STDERR})")
    start = time.perf_counter()
    with open(out / STDOUT, "w") as stdout, open(out / STDERR, "w") as stderr:
        rc = subprocess.call(
            [sys.executable, "-m", "sgl_jax_rollout_apps.cli", *argv],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    seconds = round(time.perf_counter() - start, 1)
    progress(f"{source.name}: exit {rc} after {seconds} s")
    return {"command": command, "rc": rc, "seconds": seconds}


def judge_source(source: Source, out: Path) -> list[Verdict]:
    """Every figure of `source`, judged on the output saved in `out`."""
    figures = figures_of(source)
    try:
        stdout = (out / STDOUT).read_text()
        file_text = (out / source.file).read_text() if source.file else None
        values = read_output(source, stdout, file_text)
    except (OSError, ValueError) as err:
        return [Verdict(figure, None, False, f"no output to read: {err}") for figure in figures]
    return [judge(figure, values) for figure in figures]


def check_figures(
    out: str | Path,
    only: Sequence[str] = (),
    max_minutes: float | None = None,
    saved: bool = False,
    progress: Progress = lambda line: None,
) -> dict[str, Any]:
    """Runs (or, with `saved`, reads) the chosen sources and judges their figures. The report:
    per source how it ran or why it was left out, per figure its README value, the fresh value
    and its allowed spread, and `ok` (no figure of a chosen source moved past its noise)."""
    chosen, left_out = choose(only, max_minutes)
    root = Path(out)
    sources: dict[str, Any] = {name: {"left_out": why} for name, why in left_out.items()}
    verdicts: list[Verdict] = []
    for index, source in enumerate(chosen, 1):
        where = root / slug(source)
        if saved:
            sources[source.name] = {"saved": str(where)}
        else:
            step = f"[{index}/{len(chosen)}]"
            sources[source.name] = run_source(source, where, _prefixed(progress, step))
        verdicts += judge_source(source, where)
    drifted = [verdict for verdict in verdicts if not verdict.ok]
    return {
        "sources": sources,
        "figures": [verdict.as_dict() for verdict in verdicts],
        "checked": len(verdicts),
        "drifted": len(drifted),
        "ok": not drifted,
    }


def _prefixed(progress: Progress, prefix: str) -> Progress:
    return lambda line: progress(f"{prefix} {line}")


def listing() -> str:
    """Every figure, its source's command and its noise, grouped by source."""
    lines = []
    for source in SOURCES:
        lines.append(f"{source.name} (about {source.minutes:g} min): {source.command()}")
        for figure in figures_of(source):
            lines.append(f"  {figure.text!r}: {figure.key} -> {figure.allowed()}")
    return "\n".join(lines)
