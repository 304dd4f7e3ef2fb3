"""The package layout of docs/design.md section 1: imports go one way, applications -> trainer
side (`tunix_adapter`) -> engine side (`sgl_jax_rollout`), and the library needs neither
matplotlib nor tqdm.

Read from the source (every `import`, at any depth, and any string naming a module that
`importlib` could load), so a lazy import inside a function counts; then checked in a fresh
interpreter, importing every engine-side module.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "sgl_jax_rollout": ("tunix_adapter", "sgl_jax_rollout_apps", "matplotlib", "tqdm"),
    "tunix_adapter": ("sgl_jax_rollout_apps", "matplotlib"),
}
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def imported_modules(source: str) -> set[str]:
    """Every module an `import` / `from ... import` names, anywhere in `source`, and every
    string constant that is a dotted module name (what `importlib.import_module` would get)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _MODULE_NAME.fullmatch(node.value)
        ):
            found.add(node.value)
    return found


def _hits(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in forbidden)


def test_imported_modules_finds_lazy_and_dynamic_imports():
    source = textwrap.dedent(
        """
        import json
        def f():
            from tunix_adapter.models import load_tunix_model
            import sgl_jax_rollout_apps.cli as cli
            return importlib.import_module("matplotlib.pyplot")
        x = "a sentence naming tunix_adapter, not a module"
        """
    )
    found = imported_modules(source)
    assert _hits(found, FORBIDDEN["sgl_jax_rollout"]) == [
        "matplotlib.pyplot",
        "sgl_jax_rollout_apps.cli",
        "tunix_adapter.models",
    ]
    assert "json" in found


def test_tunix_is_reached_through_tunix_compat_only():
    """Every tunix symbol goes through `sgl_jax_rollout/tunix_compat.py` (docs/design.md
    section 1, "Upstream seams"), tests included."""
    # the seam, and the tests that name tunix modules as data
    allowed = {
        ROOT / "sgl_jax_rollout" / "tunix_compat.py",
        ROOT / "tests" / "sgl_jax_rollout" / "test_tunix_compat.py",
        ROOT / "tests" / "tunix_phase.py",
        ROOT / "tests" / "test_tunix_phase.py",
        Path(__file__).resolve(),
    }
    bad = {}
    for package in (*FORBIDDEN, "sgl_jax_rollout_apps", "tpu_configs", "tests"):
        for path in sorted((ROOT / package).rglob("*.py")):
            hits = _hits(imported_modules(path.read_text()), ("tunix",))
            if hits and path not in allowed:
                bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"import tunix through sgl_jax_rollout.tunix_compat: {bad}"


def test_sgl_jax_is_reached_through_engine_upstream_only():
    """Every sgl-jax module (`sgl_jax.<...>`) is reached through
    `sgl_jax_rollout/engine/upstream.py`, tests included; the package name alone is only
    checked for presence (`engine/availability.py`, the test policy)."""
    allowed = {ROOT / "sgl_jax_rollout" / "engine" / "upstream.py", Path(__file__).resolve()}
    bad = {}
    for package in (*FORBIDDEN, "sgl_jax_rollout_apps", "tpu_configs", "tests"):
        for path in sorted((ROOT / package).rglob("*.py")):
            hits = [m for m in _hits(imported_modules(path.read_text()), ("sgl_jax",)) if "." in m]
            if hits and path not in allowed:
                bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"reach sgl-jax through sgl_jax_rollout.engine.upstream: {bad}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downstream(package):
    bad = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        hits = _hits(imported_modules(path.read_text()), FORBIDDEN[package])
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"{package} must not import {FORBIDDEN[package]}: {bad}"


def test_engine_side_modules_load_without_trainer_side_or_apps():
    """Every module of `sgl_jax_rollout` imported in a fresh interpreter (modules that need
    the sgl-jax engine are skipped where it is not installed) leaves the trainer side, the
    applications and matplotlib out of `sys.modules`."""
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import sgl_jax_rollout
        needs_engine = []
        for info in pkgutil.walk_packages(sgl_jax_rollout.__path__, "sgl_jax_rollout."):
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as err:
                if not (err.name or "").startswith("sgl_jax"):
                    raise
                needs_engine.append(info.name)
        loaded = sorted(
            m for m in sys.modules
            if m.split(".")[0] in ("tunix_adapter", "sgl_jax_rollout_apps", "matplotlib")
        )
        print("LOADED", loaded)
        print("NEEDS_ENGINE", needs_engine)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOADED []" in result.stdout, result.stdout


def _import_edges(source: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `source`'s import statements load (at any depth, lazy
    and TYPE_CHECKING ones too; `from pkg import mod` loads `pkg.mod`). Unlike
    `imported_modules`, strings do not count: a subprocess's `-m` target is no import."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found & modules


def _cycles(package: str) -> list[list[str]]:
    """Import cycles among the modules of `package` (its `__init__` files aside: importing a
    package's submodule runs them first, whoever imports it)."""
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name != "__init__.py":
            modules[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    graph = {
        name: sorted(_import_edges(path.read_text(), set(modules)) - {name})
        for name, path in modules.items()
    }
    cycles, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for nxt in graph[name]:
            if state.get(nxt) == "open":
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name, [name])
    return cycles


@pytest.mark.parametrize("package", ["sgl_jax_rollout", "tunix_adapter", "sgl_jax_rollout_apps"])
def test_no_module_imports_one_that_imports_it_back(package):
    assert not _cycles(package), _cycles(package)
