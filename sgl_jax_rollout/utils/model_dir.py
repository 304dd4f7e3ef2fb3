"""A checkpoint directory read once, with one sentence for what is wrong with it.

Owns `read_config` (`config.json` as a dict: a missing file, invalid JSON with its line and
column, or JSON that is no object, each named with the file), `check_weights` (the directory
holds `*.safetensors`, each whole: `safetensors_problem`) and `load_tokenizer` (its HF
tokenizer, or the sentence saying it does not load). `missing_key` turns a `KeyError` raised
while a family's config is read into the sentence that names the file, the key and the
family. `language_config` is the language model's part of a config, `text_config` of a
multimodal checkpoint filled as transformers fills it, and `checkpoint_prefix` the prefix its
weights sit under. Both the engine (`engine.RolloutEngine`) and the trainer side
(`tunix_adapter.models`) call these before anything is built, so a broken directory never
reaches sgl-jax or tunix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """`model_dir/config.json` as a dict; ValueError naming the file and what is wrong."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} is no model directory: it has no config.json")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
        ) from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text: {err.reason}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, it holds a {type(config).__name__}")
    return config


def missing_key(model_dir: str | Path, config: dict[str, Any], err: KeyError) -> ValueError:
    """The error for a key a family needs that `model_dir`'s config.json lacks."""
    family = config.get("model_type", "this")
    return ValueError(
        f"{Path(model_dir) / 'config.json'} has no {err.args[0]!r}, which a {family} model needs"
    )


def language_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of config.json `config`: itself, or the `text_config` a
    multimodal checkpoint (Gemma 3 4B and up, Gemma 4) nests it under. A nested part lists only
    what differs from its class's defaults (Gemma 3 4B's names its sizes, window and RoPE
    scaling, not its heads, head_dim or vocabulary), so it is filled as transformers fills it
    (its `CONFIG_MAPPING` class, where transformers knows the `model_type`), and it takes the
    checkpoint's dtype when it names none (`torch_dtype` or `dtype` at the top level)."""
    text = config.get("text_config")
    if not text:
        return config
    from transformers import CONFIG_MAPPING

    if text.get("model_type") in CONFIG_MAPPING:
        filled = CONFIG_MAPPING[text["model_type"]](**text).to_dict()
        text = {**filled, **text}
    if not (text.get("torch_dtype") or text.get("dtype")):
        dtype = config.get("torch_dtype") or config.get("dtype")
        text = {**text, "torch_dtype": dtype} if dtype else text
    return text


# Where a multimodal checkpoint keeps its language model: Google's Gemma 3 checkpoints and
# transformers' `save_pretrained` write `language_model.model.`, transformers' in-memory names
# are `model.language_model.` (`modeling_gemma3.py`, `_checkpoint_conversion_mapping`).
LANGUAGE_MODEL_PREFIXES = ("language_model.model.", "model.language_model.")


def checkpoint_prefix(model_dir: str | Path, architecture: str) -> str:
    """The prefix of `LANGUAGE_MODEL_PREFIXES` under which `model_dir`'s safetensors hold the
    language model's embedding (read from their headers); ValueError naming both when they
    hold it under neither."""
    from safetensors import safe_open

    names: set[str] = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:
            names.update(f.keys())
    for prefix in LANGUAGE_MODEL_PREFIXES:
        if prefix + "embed_tokens.weight" in names:
            return prefix
    raise ValueError(
        f"{model_dir}: a {architecture} checkpoint holds its language model under "
        f"{' or '.join(LANGUAGE_MODEL_PREFIXES)} (embed_tokens.weight there); its safetensors "
        "hold neither"
    )


# Bytes per element of each safetensors dtype.
_DTYPE_BYTES = {
    **dict.fromkeys(("F64", "I64", "U64"), 8),
    **dict.fromkeys(("F32", "I32", "U32"), 4),
    **dict.fromkeys(("F16", "BF16", "I16", "U16"), 2),
    **dict.fromkeys(("F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL"), 1),
}


def check_weights(model_dir: str | Path) -> None:
    """ValueError when `model_dir` holds no `*.safetensors` file (the weights), or one whose
    header does not match its data (`safetensors_problem`: a truncated download, say), naming
    the file, the first tensor out of place and the cause."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{model_dir} holds no *.safetensors file: the checkpoint's weights are missing"
        )
    for path in files:
        problem = safetensors_problem(path)
        if problem is not None:
            raise ValueError(f"{path} is not a whole safetensors file: {problem}")


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's layout (its 8-byte header length, the JSON
    header, each tensor's byte range against its shape and dtype and against the data the
    file holds), or None. Reads the header only."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        head = file.read(8)
        if len(head) < 8:
            return f"{size} bytes, fewer than the 8 of the header length"
        length = int.from_bytes(head, "little")
        if 8 + length > size:
            return f"the header claims {length} bytes, the file holds {size - 8} after its length"
        try:
            header = json.loads(file.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"its header is not JSON ({err})"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    data = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in entry["data_offsets"])
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            need = count * _DTYPE_BYTES[entry["dtype"]]
        except (KeyError, TypeError, ValueError) as err:
            return f"tensor {name!r} has no valid dtype, shape and data_offsets ({err!r})"
        if end - start != need:
            return (
                f"tensor {name!r} ({entry['dtype']} {entry['shape']}) needs {need} bytes, its "
                f"data_offsets span {end - start}"
            )
        if end > data:
            return (
                f"tensor {name!r} ({entry['dtype']} {entry['shape']}) lies at bytes "
                f"[{start}, {end}) of the data, which holds {data}: the file is truncated"
            )
    return None


def load_tokenizer(model_dir: str | Path) -> Any:
    """`model_dir`'s HF tokenizer; ValueError naming the directory when it does not load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as err:  # transformers raises OSError, ValueError, JSON and others
        raise ValueError(
            f"{model_dir}'s tokenizer does not load ({type(err).__name__}: {err})"
        ) from err
