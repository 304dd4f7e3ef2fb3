"""`make_tiny_model`: writes the built-in tiny model directory, offline and deterministically.

Owns the files of docs/design.md section 6: `config.json` (HF layout for qwen3, qwen2 or llama),
`model.safetensors` with seeded random float32 weights scaled so next-token distributions
have varied, clearly non-uniform entropy, `generation_config.json`, and the tokenizer files
(from `tokenizer.py`). The same seed gives the same bytes. The model's `vocab_size` equals the
tokenizer's length, so no padded id exists.

Must not import tunix or sgl_jax: both read the directory through their own loaders.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from sgl_jax_rollout.tiny_model.tokenizer import (
    BOS,
    CHAT_TEMPLATE,
    EOS,
    IM_START,
    PAD,
    THINK_END,
    THINK_START,
    train_tokenizer,
)

log = logging.getLogger(__name__)

ARCHITECTURES = {
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "llama": ("LlamaForCausalLM", "llama"),
}
MIN_VOCAB = 300
DEFAULT_VOCAB = 1024


@dataclasses.dataclass(frozen=True)
class TinyShape:
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    # sgl-jax's KV pool pads head_dim to 128 and its CPU attention does not cut the padding off
    # the output (pinned commit): a smaller head_dim breaks the engine, so use 128.
    head_dim: int = 128
    max_positions: int = 2048
    # Std of the output projection: with unit-RMS hidden states, logits std ~ 0.3 * sqrt(64).
    lm_head_std: float = 0.3


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen3",
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
    shape: TinyShape = TinyShape(),
) -> Path:
    """Writes the model directory and returns its path. Overwrites our own files only."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {arch!r}")
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size must be an integer >= {MIN_VOCAB}, got {vocab_size!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(vocab_size, seed)
    vocab = tokenizer.get_vocab_size()
    ids = {name: tokenizer.token_to_id(name) for name in (PAD, BOS, EOS, THINK_START, THINK_END)}
    _save_tokenizer(tokenizer, out)

    config = _hf_config(arch, vocab, shape, ids)
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": ids[BOS],
            "eos_token_id": [ids[EOS]],
            "pad_token_id": ids[PAD],
            "do_sample": True,
            "temperature": 1.0,
            "top_k": -1,
            "top_p": 1.0,
        },
    )
    tensors = _random_weights(arch, vocab, shape, seed)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    log.info("tiny %s model (vocab %d, %d tensors) written to %s", arch, vocab, len(tensors), out)
    return out


def _hf_config(arch: str, vocab: int, s: TinyShape, ids: dict[str, int]) -> dict:
    architecture, model_type = ARCHITECTURES[arch]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": s.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "think_start_token_id": ids[THINK_START],
        "think_end_token_id": ids[THINK_END],
    }
    if arch == "qwen3":
        config["attention_bias"] = False
    if arch == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=s.layers)
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False, rope_scaling=None)
    return config


def _random_weights(arch: str, vocab: int, s: TinyShape, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight(size: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(size) * 0.1).astype(np.float32)

    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    tensors = {"model.embed_tokens.weight": normal(vocab, s.hidden, std=1.0)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = norm_weight(s.hidden)
        tensors[p + "post_attention_layernorm.weight"] = norm_weight(s.hidden)
        tensors[p + "self_attn.q_proj.weight"] = normal(q, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv, s.hidden, std=s.hidden**-0.5)
        tensors[p + "self_attn.o_proj.weight"] = normal(s.hidden, q, std=q**-0.5)
        if arch == "qwen2":
            tensors[p + "self_attn.q_proj.bias"] = normal(q, std=0.1)
            tensors[p + "self_attn.k_proj.bias"] = normal(kv, std=0.1)
            tensors[p + "self_attn.v_proj.bias"] = normal(kv, std=0.1)
        if arch == "qwen3":
            tensors[p + "self_attn.q_norm.weight"] = norm_weight(s.head_dim)
            tensors[p + "self_attn.k_norm.weight"] = norm_weight(s.head_dim)
        tensors[p + "mlp.gate_proj.weight"] = normal(s.intermediate, s.hidden, std=s.hidden**-0.5)
        tensors[p + "mlp.up_proj.weight"] = normal(s.intermediate, s.hidden, std=s.hidden**-0.5)
        tensors[p + "mlp.down_proj.weight"] = normal(
            s.hidden, s.intermediate, std=s.intermediate**-0.5
        )
    tensors["model.norm.weight"] = norm_weight(s.hidden)
    tensors["lm_head.weight"] = normal(vocab, s.hidden, std=s.lm_head_std)
    return tensors


def _save_tokenizer(tokenizer, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, THINK_START, THINK_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=TinyShape().max_positions,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def default_model_dir() -> Path:
    """The built-in qwen3 tiny model (seed 0), built on first use in the user cache.

    `$SGL_JAX_ROLLOUT_CACHE` overrides the cache root (default `~/.cache/sgl-jax-rollout`).
    The files are deterministic, so an existing complete directory is reused as is.
    """
    root = Path(os.environ.get("SGL_JAX_ROLLOUT_CACHE", Path.home() / ".cache" / "sgl-jax-rollout"))
    out = root / "tiny-qwen3-seed0"
    if not (out / "model.safetensors").is_file():
        staging = Path(tempfile.mkdtemp(prefix="tiny-", dir=root if root.exists() else None))
        make_tiny_model(staging)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(out)
        except OSError:  # another process finished first: its files are identical
            shutil.rmtree(staging, ignore_errors=True)
    return out
