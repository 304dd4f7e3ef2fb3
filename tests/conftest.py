"""Markers: `engine` tests need sgl_jax importable, `tpu` tests need a TPU; both skip otherwise."""

from __future__ import annotations

import importlib.util

import pytest


def _has_tpu() -> bool:
    import jax

    try:
        return bool(jax.devices("tpu"))
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    no_engine = importlib.util.find_spec("sgl_jax") is None
    for item in items:
        if no_engine and "engine" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="sgl_jax is not installed"))
        if "tpu" in item.keywords and not _has_tpu():
            item.add_marker(pytest.mark.skip(reason="no TPU present"))
