"""Which tests run again under tunix main (`make test-tunix-main`): the ones that touch tunix.

A test module touches tunix when one of its imports (at any depth of its source), followed
through the module-level imports of the project's own modules, reaches tunix, the trainer side
(`tunix_adapter`), the compatibility module (`sgl_jax_rollout.tunix_compat`) or the
applications (`sgl_jax_rollout_apps`, whose commands drive the trainer); or when it runs one of
the suite's worker modules (`-m tests....`) that does. A test also touches tunix when it uses a
fixture that loads the trainer's model (`TRAINER_FIXTURES`). conftest.py marks such tests
`tunix`; tests/test_tunix_phase.py fails when a module that cannot be imported without tunix is
not marked.

Must not import the project's packages: it reads their source.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = (
    "sgl_jax_rollout",
    "tunix_adapter",
    "tpu_configs",
    "sgl_jax_rollout_apps",
    "tests",
)
TUNIX_SIDE = ("tunix", "tunix_adapter", "sgl_jax_rollout.tunix_compat", "sgl_jax_rollout_apps")
TRAINER_FIXTURES = frozenset({"trainer", "real_trainer"})
_WORKER = re.compile(r"""["'](tests(?:\.\w+)+)["']""")


def _is_under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def _source_file(name: str) -> Path | None:
    """The project file of module `name` (a package's `__init__.py`), None outside it."""
    if not _is_under(name, PROJECT_PACKAGES):
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module_level_only: bool) -> set[str]:
    """Modules `path` imports: `from a import b` gives `a` and `a.b`."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@functools.cache
def _module_reaches_tunix(name: str, seen: frozenset[str] = frozenset()) -> bool:
    if _is_under(name, TUNIX_SIDE):
        return True
    path = _source_file(name)
    if path is None or name in seen:
        return False
    return any(
        _module_reaches_tunix(other, seen | {name})
        for other in _imports(path, module_level_only=True)
    )


@functools.cache
def touches_tunix(path: Path) -> bool:
    """Whether the test module (or worker module) at `path` touches tunix (module docstring)."""
    source = path.read_text()
    if any(_module_reaches_tunix(name) for name in _imports(path, module_level_only=False)):
        return True
    workers = (_source_file(name) for name in _WORKER.findall(source))
    return any(worker is not None and touches_tunix(worker) for worker in workers)
