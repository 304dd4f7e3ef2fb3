"""The engine-requirement policy and the run order of tests/conftest.py, run on a throw-away
suite with pytester.

Where `SGL_JAX_ROLLOUT_REQUIRE_ENGINE=1` (CI), an engine-marked test that skips fails, a
tpu-marked one may still skip, and a missing engine stops the run. An empty `sgl_jax` package
in the throw-away directory stands in for the installed engine: these tests are about the
policy, not the engine. `sys.modules["sgl_jax"] = None` hides an installed engine from
`importlib.util.find_spec`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
SUITE = """
import pytest

@pytest.mark.engine
def test_engine_skips():
    pytest.skip("no engine here")

@pytest.mark.engine
def test_engine_runs():
    pass

@pytest.mark.engine
@pytest.mark.tpu
def test_needs_a_tpu():
    pass

def test_plain_skip():
    pytest.skip("not about the engine")
"""


HIDE_ENGINE = 'import sys\n\nsys.modules["sgl_jax"] = None\n'


def _suite(pytester, engine: bool):
    if engine:
        pytester.mkpydir("sgl_jax")
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    engine: e\n    tpu: t\n")
    # Collection imports the test module before the conftest looks for the engine.
    pytester.makepyfile(test_suite=("" if engine else HIDE_ENGINE) + SUITE)
    return pytester


def test_a_skipped_engine_test_fails_where_the_engine_is_required(pytester, monkeypatch):
    suite = _suite(pytester, engine=True)
    monkeypatch.setenv("SGL_JAX_ROLLOUT_REQUIRE_ENGINE", "1")
    result = suite.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    result.stdout.fnmatch_lines(
        ["engine test skipped while SGL_JAX_ROLLOUT_REQUIRE_ENGINE=1: no engine here"]
    )


def test_engine_tests_skip_where_the_engine_is_optional(pytester, monkeypatch):
    suite = _suite(pytester, engine=False)
    monkeypatch.setenv("SGL_JAX_ROLLOUT_REQUIRE_ENGINE", "0")
    result = suite.runpytest_subprocess()
    result.assert_outcomes(skipped=4)


def test_a_missing_engine_stops_the_run_where_it_is_required(pytester, monkeypatch):
    suite = _suite(pytester, engine=False)
    monkeypatch.setenv("SGL_JAX_ROLLOUT_REQUIRE_ENGINE", "1")
    result = suite.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*SGL_JAX_ROLLOUT_REQUIRE_ENGINE=1 but sgl_jax is not importable*"]
    )


ORDERED = {
    "test_a": "def test_a1():\n    pass\n\ndef test_a2(rollout):\n    pass\n",
    "test_b": (
        "import pytest\n\ndef test_b1():\n    pass\n\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_b2(x):\n    pass\n\n"
        "def test_b3():\n    pass\n"
    ),
    "test_c": "def test_c1(rollout):\n    pass\n",
}
ROLLOUT_FIXTURE = "\n\n@pytest.fixture\ndef rollout():\n    return None\n"


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("", ["a1", "b1", "b2[1]", "b2[2]", "b3", "a2", "c1"]),
        # a parametrized test's cases reversed too, its place among the module's tests kept
        ("reversed", ["c1", "a2", "b1", "b2[2]", "b2[1]", "b3", "a1"]),
    ],
)
def test_the_session_engines_tests_run_last_or_reversed_first(
    pytester, monkeypatch, order, expected
):
    pytester.makeconftest(CONFTEST.read_text() + ROLLOUT_FIXTURE)
    pytester.makepyfile(**ORDERED)
    monkeypatch.setenv("SGL_JAX_ROLLOUT_TEST_ORDER", order)
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    ran = [line.split("::test_")[1] for line in result.outlines if "::test_" in line]
    assert ran == expected


def test_an_unknown_order_stops_the_run(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    monkeypatch.setenv("SGL_JAX_ROLLOUT_TEST_ORDER", "random")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*SGL_JAX_ROLLOUT_TEST_ORDER must be 'reversed' or unset*"])
