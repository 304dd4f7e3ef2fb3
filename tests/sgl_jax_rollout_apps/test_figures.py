"""`sgl-jax-rollout figures` (no engine): the registry says what the README says, a figure is
read from each kind of output, judged against its noise, and the command exits 1 when a saved
run moved a figure past it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_jax_rollout_apps.cli import main
from sgl_jax_rollout_apps.figures import runner
from sgl_jax_rollout_apps.figures.registry import FIGURES, SOURCES
from sgl_jax_rollout_apps.figures.spec import Figure, Source, judge, lookup, read_output

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PROVEN = README.split("## What is proven", 1)[1].split("\n## ", 1)[0]


def test_every_figure_is_written_so_in_the_readme():
    assert len(FIGURES) >= 60
    missing = [figure.text for figure in FIGURES if figure.text not in README]
    assert not missing, f"the README no longer writes these (update registry.py): {missing}"


def test_every_source_has_figures_and_every_figure_a_source():
    names = [source.name for source in SOURCES]
    assert len(set(names)) == len(names)
    assert {figure.source for figure in FIGURES} == set(names)


def test_every_row_of_the_table_with_a_figure_is_checked():
    rows = [line for line in PROVEN.splitlines() if line.startswith("| ") and "---" not in line]
    unchecked = [
        row.split(" | ")[0]
        for row in rows[1:]
        if not any(figure.text in row for figure in FIGURES)
        and "matches the single-process run" not in row  # a test's claim, no figure
    ]
    assert not unchecked, unchecked


def test_every_source_is_a_command_the_cli_accepts():
    # each source's flags pass the CLI's own parser and its per-command range checks
    # (a bad one, `bench tail --runs 1`, is refused: parser.error exits 2)
    from sgl_jax_rollout_apps import cli

    for source in SOURCES:
        cli.parse([a.format(out="out", model="model") for a in source.argv])
    with pytest.raises(SystemExit):
        cli.parse(["bench", "tail", "--runs", "1"])


def test_every_source_names_a_model_the_runner_builds():
    # a source's `model` is "builtin" or a real checkpoint's name (`real_model.MODELS`): the
    # runner builds its directory before the command starts ("smollm2" once stopped it there)
    from sgl_jax_rollout_apps.real_model import MODELS

    named = {source.model for source in SOURCES} - {None}
    assert named and named <= {"builtin", *MODELS}, named - {"builtin", *MODELS}


def test_the_figure_is_the_bracketed_number():
    figure = Figure("16 calls at once: [0.185] s", "s", "k", 0.5)
    assert figure.text == "16 calls at once: 0.185 s"
    assert figure.value == 0.185
    assert Figure("[613,947,356] B", "s", "k", 0).value == 613_947_356
    with pytest.raises(ValueError, match="bracket"):
        _ = Figure("1.16x", "s", "k", 0.25).value


@pytest.mark.parametrize(
    "figure, measured, ok",
    [
        (Figure("[2.0] s", "s", "k", 0.5), 2.9, True),
        (Figure("[2.0] s", "s", "k", 0.5), 3.1, False),
        (Figure("[2.0] s", "s", "k", 0.5), 0.9, False),
        (Figure("[3.34e-06]", "s", "k", 1.0, bound="upper"), 1e-9, True),
        (Figure("[3.34e-06]", "s", "k", 1.0, bound="upper"), 7e-6, False),
        (Figure("[1.000]", "s", "k", 0, bound="lower"), 1.0, True),
        (Figure("[1.000]", "s", "k", 0, bound="lower"), 0.99, False),
        (Figure("[0.1]%", "s", "k", 0, floor=0.9, bound="upper"), 0.95, True),
        (Figure("[0.1]%", "s", "k", 0, floor=0.9, bound="upper"), 1.2, False),
        (Figure("[0] bad", "s", "k", 0, bound="upper"), 1, False),
    ],
)
def test_a_figure_is_kept_within_its_noise_and_its_bound(figure, measured, ok):
    verdict = judge(figure, {"k": measured})
    assert verdict.ok is ok, verdict.why
    assert verdict.measured == measured


def test_a_derived_figure_and_a_missing_key():
    ratio = Figure("[1.58]x", "s", "a.ours", 0.25, over="a.vanilla")
    assert judge(ratio, {"a": {"ours": 0.4158, "vanilla": 0.2639}}).ok
    verdict = judge(ratio, {"a": {"ours": 1.0}})
    assert not verdict.ok and "not in the output" in verdict.why


def test_keys_that_hold_dots_are_matched_whole():
    values = {"logprob_fidelity": {"T=1.0": {"sglang_jax": {"max_abs_diff": 3.8e-6}}}}
    assert lookup(values, "logprob_fidelity.T=1.0.sglang_jax.max_abs_diff") == 3.8e-6
    assert lookup({"sizes": {"16": {"ratio": 1.156}}}, "sizes.16.ratio") == 1.156
    with pytest.raises(KeyError):
        lookup({"ok": True}, "ok")  # not a number


def test_check_table_rows_are_read_from_the_readmes_sample_output():
    section = README.split("## Before a long run", 1)[1]
    sample = "check" + section.split("```\ncheck", 1)[1].split("```", 1)[0]
    rows = read_output(Source("check", (), "table", 1), "check: a progress line\n" + sample)
    (figure,) = [figure for figure in FIGURES if figure.source == "check"]
    assert rows[figure.key] == pytest.approx(figure.value, rel=0.01)
    assert rows["greedy tokens = trainer argmax (share, from 1024)"] == 1
    assert len(rows) == 11


def test_json_is_the_last_line_that_parses_and_jsonl_its_first_and_last_rows():
    bench = Source("b", (), "json", 1)
    stdout = 'progress {not json\n{"ratio": 1.2}\n'
    assert read_output(bench, stdout) == {"ratio": 1.2}
    with pytest.raises(ValueError, match="no JSON object"):
        read_output(bench, "nothing here\n")
    rows = read_output(Source("d", (), "jsonl", 1, file="m.jsonl"), "", '{"r": 1}\n{"r": 2}\n')
    assert rows == {"first": {"r": 1}, "last": {"r": 2}}


def _saved(tmp_path: Path, ratio_moved_by: float) -> Path:
    """A saved `bench concurrency` output holding the README's figures, its ratio moved."""
    values: dict = {}
    for figure in FIGURES:
        if figure.source == "bench concurrency":
            *path, last = figure.key.split(".")
            node = values
            for part in path:
                node = node.setdefault(part, {})
            node[last] = figure.value * (ratio_moved_by if last == "ratio" else 1.0)
    where = tmp_path / "bench-concurrency"
    where.mkdir(parents=True)
    (where / runner.STDOUT).write_text(json.dumps(values) + "\n")
    return tmp_path


def test_figures_exits_1_naming_the_figure_a_saved_run_moved(tmp_path, capsys):
    out = _saved(tmp_path, ratio_moved_by=2.0)
    assert main(["figures", "--saved", "--out", str(out), "--only", "bench concurrency"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["checked"] == 3 and report["drifted"] == 1
    assert report["sources"]["bench soak"] == {"left_out": "not asked for"}
    (ratio,) = [f for f in FIGURES if f.source == "bench concurrency" and f.key.endswith("ratio")]
    assert f"{ratio.text!r} (bench concurrency): moved to {2 * ratio.value:.4g}" in captured.err


def test_figures_passes_a_saved_run_within_the_noise(tmp_path, capsys):
    out = _saved(tmp_path, ratio_moved_by=1.1)
    assert main(["figures", "--saved", "--out", str(out), "--only", "bench concurrency"]) == 0
    assert "3 of 3 figures within their noise" in capsys.readouterr().err


def test_max_minutes_leaves_the_long_sources_out_and_an_unknown_one_is_refused(capsys):
    chosen, left_out = runner.choose(max_minutes=5)
    assert chosen and all(source.minutes <= 5 for source in chosen)
    assert "over --max-minutes 5" in left_out["bench rollout"]
    assert main(["figures", "--only", "bench nothing"]) == 2
    assert "unknown source" in capsys.readouterr().err
