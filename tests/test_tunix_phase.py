"""The tests that run again under tunix main (tests/tunix_phase.py) include every test that
touches tunix: a module that cannot be imported without tunix is never left out."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.tunix_phase import ROOT, touches_tunix

# Imports each named test module with tunix made unimportable; prints those that needed it.
BLOCKED_IMPORTS = """
import importlib, importlib.abc, sys

class NoTunix(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "tunix" or name.startswith("tunix."):
            raise ImportError("tunix is blocked")

sys.meta_path.insert(0, NoTunix())
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as err:
        if "tunix is blocked" in str(err):
            print(name)
"""


def test_no_test_module_outside_the_tunix_phase_imports_tunix():
    others = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if not touches_tunix(path)
    ]
    assert others, "every test module touches tunix: the check below would check nothing"
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS, *others],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [], (
        "these test modules import tunix but make test-tunix-main would leave them out "
        f"(tests/tunix_phase.py): {done.stdout.split()}"
    )


def test_a_test_touches_tunix_through_any_import_a_worker_or_a_project_module(tmp_path):
    cases = {
        "in_function": "def test_x():\n    from tunix_adapter.models import load_tunix_model\n",
        "via_rollout": "from sgl_jax_rollout.rollout import SglangJaxRollout\n",
        "compat": "import sgl_jax_rollout.tunix_compat as compat\n",
        "apps": "def test_x():\n    from sgl_jax_rollout_apps import cli\n",
        "worker": 'WORKER = ["python", "-m", "tests.tunix_adapter.grpo_hosts_worker"]\n',
        "engine_only": "from sgl_jax_rollout.sampling import sampler\nimport numpy\n",
        "engine_worker": 'W = ["-m", "tests.sgl_jax_rollout.sampling.vocab_parallel_worker"]\n',
    }
    found = {}
    for name, source in cases.items():
        path = tmp_path / f"test_{name}.py"
        path.write_text(textwrap.dedent(source))
        found[name] = touches_tunix(path)
    assert found == {
        "in_function": True,
        "via_rollout": True,
        "compat": True,
        "apps": True,
        "worker": True,
        "engine_only": False,
        "engine_worker": False,
    }


def test_make_test_tunix_main_selects_the_tunix_marker():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest-tunix-main:", 1)[1].split("\n\n", 1)[0]
    assert "-m tunix" in recipe, recipe
