"""docs/design.md's "Where things live" map stays true: every path it names exists, and no
module of the four packages outgrows the size a reader can take in (issue 63: 400 lines)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sgl_jax_rollout", "tunix_adapter", "tpu_configs", "sgl_jax_rollout_apps")
MAX_LINES = 400


def map_paths() -> list[str]:
    design = (ROOT / "docs" / "design.md").read_text()
    section = design.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`([\w/.]+(?:\.py|/))`", section)


def test_every_path_in_the_map_exists():
    paths = map_paths()
    assert len(paths) >= 20, paths
    missing = [path for path in paths if not (ROOT / path).exists()]
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_no_module_of_the_packages_is_over_400_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules by job (at most {MAX_LINES} lines): {long}"
