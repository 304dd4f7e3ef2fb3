"""JAX's persistent compilation cache, as the engine, the trainer and the CLI turn it on.

Owns where compiled programs are kept on disk and when the cache is on: off unless a
directory is named, by `EngineSettings.compilation_cache_dir`, the CLI's
`--compilation-cache DIR`, or the environment variable `SGL_JAX_ROLLOUT_COMPILATION_CACHE_DIR`
(in that order). The cache is process-wide in JAX: once on, every program of the process
(engine and trainer alike) is read from and written to it.

What may be reused: JAX keys each entry by the program's StableHLO (the model's shapes and
dtypes, the mesh's shardings), the devices, the compile options and flags, and the jax /
jaxlib version; a program is reused only where all of these are equal. On top of that, each
sgl-jax build gets a folder of its own under the directory (`sgl-jax-<version>`, whose
setuptools-scm local part names the commit), so a new sgl-jax never reads programs compiled
under another, even where they lower alike.

Must not import sgl_jax (the version comes from the installed distribution's metadata) and
must not change JAX's cache settings when no directory is named (a user's own
`JAX_COMPILATION_CACHE_DIR` then applies as upstream applies it).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_DIR_VAR = "SGL_JAX_ROLLOUT_COMPILATION_CACHE_DIR"
# sgl-jax's scheduler points JAX at this variable's directory when it starts
# (`Scheduler._setup_jit_cache`, managers/scheduler.py, sgl-jax cddbf6f1).
UPSTREAM_CACHE_DIR_VAR = "JAX_COMPILATION_CACHE_DIR"
SGL_JAX_DISTRIBUTION = "sglang-jax"


def cache_root(
    setting: str | os.PathLike | None = None, name: str = "compilation_cache_dir"
) -> Path | None:
    """The cache directory asked for: `setting` (called `name` in errors), else the
    environment variable, else None.

    Raises ValueError when the directory names a file, or when JAX_COMPILATION_CACHE_DIR names
    another directory (sgl-jax's scheduler would point the cache there at start)."""
    if setting is None or str(setting) == "":
        setting, name = os.environ.get(CACHE_DIR_VAR) or None, CACHE_DIR_VAR
    if setting is None:
        return None
    root = Path(setting).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise ValueError(f"{name} must name a directory, got the file {root}")
    upstream = os.environ.get(UPSTREAM_CACHE_DIR_VAR)
    if upstream and Path(upstream).expanduser().absolute() != cache_directory(root).absolute():
        raise ValueError(
            f"{name} ({root}) and {UPSTREAM_CACHE_DIR_VAR} ({upstream}) both name a compilation "
            f"cache: unset {UPSTREAM_CACHE_DIR_VAR} (sgl-jax would point the cache at it when "
            f"the engine starts) or leave {name} unset"
        )
    return root


def sgl_jax_build() -> str:
    """The installed sgl-jax's version (`0.0.3.dev0+gcddbf6f1`: the commit is its local part),
    or "none" where sgl-jax is not installed (the trainer alone)."""
    try:
        return importlib.metadata.version(SGL_JAX_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cache_directory(root: str | os.PathLike) -> Path:
    """The folder under `root` that programs compiled with this sgl-jax build go to."""
    build = re.sub(r"[^A-Za-z0-9._-]", "_", sgl_jax_build())
    return Path(root) / f"sgl-jax-{build}"


def enable_compilation_cache(root: str | os.PathLike) -> Path:
    """Points JAX's persistent compilation cache at `cache_directory(root)` for the rest of
    the process and caches every program, however quickly it compiled (sgl-jax's own choice
    when it sets the cache up). Returns that folder. Calling it again with the same root
    changes nothing; with another root, the process's cache moves there."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    directory = cache_directory(root)
    directory.mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir == str(directory):
        return directory
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # JAX opens the cache once per process, at its first compile: a new folder needs a reset.
    compilation_cache.reset_cache()
    if previous:
        logger.info("compilation cache moved from %s to %s", previous, directory)
    else:
        logger.info("compilation cache at %s", directory)
    return directory
