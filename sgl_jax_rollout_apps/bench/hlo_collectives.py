"""What a compiled program moves between devices, read from its optimised HLO text.

Owns `collective_bytes`: the collectives of a partitioned (per-device) program, each counted
by the bytes of its result on one device, summed along the paths one call can take from the
entry computation: a while loop's body counts its known trip count times, a conditional its
cheapest branch (`min_per_call`) or its costliest (`max_per_call`).

Must not be imported by the library: it serves the sampler benchmark.
"""

from __future__ import annotations

import re

COLLECTIVES = (
    "all-gather",
    "all-gather-start",
    "all-reduce",
    "all-reduce-start",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-permute-start",
)
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2}
_BYTES.update({"s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8})
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_OP = re.compile(r"=\s*(?P<type>.+?)\s+(?P<op>[a-z][a-z0-9-]*)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition)=%([\w.\-]+)")
_BRANCHES = re.compile(
    r"\b(?:branch_computations=\{([^}]*)\}|(?:true|false)_computation=%([\w.\-]+))"
)
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def collective_bytes(hlo_text: str) -> dict:
    """`{"min_per_call", "max_per_call"}` bytes of collective results per device, and the
    number of collective instructions (`collectives`) in the program."""
    computations: dict[str, list[str]] = {}
    entry = current = None
    for line in hlo_text.splitlines():
        start = _COMPUTATION.match(line)
        if start:
            current = start.group("name")
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif current is not None:
            computations[current].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    count = 0
    memo: dict[str, tuple[int, int]] = {}

    def bounds(name: str) -> tuple[int, int]:
        nonlocal count
        if name in memo:
            return memo[name]
        low = high = 0
        for line in computations.get(name, ()):
            op = _OP.search(line)
            if op and op.group("op") in COLLECTIVES:
                size = _result_bytes(op.group("type"), op.group("op"))
                count += 1
                low, high = low + size, high + size
            trips = 1
            if op and op.group("op") == "while":
                known = _TRIP_COUNT.search(line)
                if known is None:
                    raise ValueError(f"a while loop without a known trip count: {line.strip()}")
                trips = int(known.group(1))
            for called in _CALLED.findall(line):
                lo, hi = bounds(called)
                low, high = low + lo * trips, high + hi * trips
            branches = [
                b
                for listed, single in _BRANCHES.findall(line)
                for b in [*re.findall(r"%([\w.\-]+)", listed), *filter(None, [single])]
            ]
            if branches:
                each = [bounds(b) for b in branches]
                low, high = low + min(lo for lo, _ in each), high + max(hi for _, hi in each)
        memo[name] = (low, high)
        return memo[name]

    low, high = bounds(entry)
    return {"min_per_call": low, "max_per_call": high, "collectives": count}


def _result_bytes(type_text: str, op: str) -> int:
    sizes = [
        _BYTES[dtype] * _product(int(d) for d in dims.split(",") if d)
        for dtype, dims in _ARRAY.findall(type_text)
    ]
    # An async start's result is a tuple holding its operand too: count the largest part.
    return max(sizes) if op.endswith("-start") else sum(sizes)


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out
