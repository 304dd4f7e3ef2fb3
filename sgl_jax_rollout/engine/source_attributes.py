"""The attributes an instance of a class can have, read from its classes' source.

Owns `class_attributes`, which `upstream.check` uses to find, before an engine is built, the
attributes we read on sgl-jax objects: instance attributes exist only once an object is
built, so they are read from the `self.<name> = ...` assignments of each class of the MRO.
Pure Python: imports neither sgl-jax nor tunix.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap


@functools.cache
def class_attributes(cls: type) -> frozenset[str]:
    """Every attribute an instance of `cls` can have, read from the classes of its MRO: class
    members, dataclass fields and annotations, and `self.<name>` assignment targets in their
    source (instance attributes exist only once an object is built)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(vars(klass))
        names.update(getattr(klass, "__annotations__", {}))
        if dataclasses.is_dataclass(klass):
            names.update(f.name for f in dataclasses.fields(klass))
        names.update(_assigned_self_attributes(klass))
    return frozenset(names)


def _assigned_self_attributes(klass: type) -> set[str]:
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return set()
    found = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    found.add(sub.attr)
    return found
