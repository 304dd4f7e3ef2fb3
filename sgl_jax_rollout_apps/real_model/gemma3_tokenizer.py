"""Gemma 3's tokenizer rebuilt from a GGUF file's SentencePiece vocabulary, as an HF fast one.

Owns `save` and `bpe_merges`. The GGUF (`tokenizer.ggml.model` "llama") holds Gemma's
SentencePiece BPE model as three lists: 262,144 pieces, their scores and their kinds (normal,
control, user-defined, byte). This writes what transformers' `GemmaConverter`
(`convert_slow_tokenizer.py`) writes from the original `tokenizer.model`:

- a BPE model over the pieces, its merges derived from the scores as transformers'
  `generate_merges` derives them (a piece's merges rank by its score: SentencePiece's BPE
  joins the best-scored pair first); merges only make normal pieces. Characters missing from
  the vocabulary fall back to their UTF-8 bytes (`<0x00>` .. `<0xFF>`, ids 238 .. 493);
- spaces become "▁" (`Replace`), and no "▁" is put before the text (Gemma's
  `add_dummy_prefix` is false); decoding reverses both and joins the byte pieces;
- control pieces (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, `<mask>` 4, `<start_of_turn>`
  105, `<end_of_turn>` 106, `<unusedN>`) are special added tokens; user-defined pieces (runs of
  newlines, spaces or tabs, `<start_of_image>`, HTML tags ...) are added tokens matched whole in
  the raw text, as SentencePiece and llama.cpp match them (llama.cpp stored their "▁" as spaces,
  which is the raw text they match);
- `<bos>` before every text (`add_bos_token`), no `<eos>` after; pad `<pad>`.

The file holds no chat template (the pretrained checkpoint's conversion wrote none): none is
written. Must not touch model weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6  # llama.cpp's token types (SentencePiece's)
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
TURN_TOKENS = ["<start_of_turn>", "<end_of_turn>"]


def bpe_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """The BPE merges that make each normal piece from two normal pieces, best score first
    (ties: the longer left part first), as transformers' `generate_merges` orders them."""
    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types, strict=True)) if kind == NORMAL}
    merges: list[tuple[str, str, float]] = []
    for piece, score, kind in zip(tokens, scores, types, strict=True):
        if kind != NORMAL:
            continue
        local = [
            (piece[:cut], piece[cut:], score)
            for cut in range(1, len(piece))
            if piece[:cut] in vocab and piece[cut:] in vocab
        ]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def save(fields: dict[str, Any], out: Path, max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import GemmaTokenizerFast

    tokens = fields["tokenizer.ggml.tokens"]
    scores = fields["tokenizer.ggml.scores"]
    types = fields["tokenizer.ggml.token_type"]
    if len(set(tokens)) != len(tokens):
        raise ValueError("the GGUF vocabulary repeats a piece")
    for token_id, token in enumerate([PAD, EOS, BOS, UNK]):
        if tokens[token_id] != token or types[token_id] != CONTROL:
            raise ValueError(f"GGUF token {token_id} is {tokens[token_id]!r}, expected {token}")
    model = models.BPE(
        vocab={token: i for i, token in enumerate(tokens)},
        merges=bpe_merges(tokens, scores, types),
        unk_token=UNK,
        fuse_unk=True,
        byte_fallback=True,
        dropout=None,
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.add_tokens(
        [
            AddedToken(token, normalized=False, special=kind == CONTROL)
            for token, kind in zip(tokens, types, strict=True)
            if kind in (CONTROL, USER_DEFINED)
        ]
    )
    fast = GemmaTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=TURN_TOKENS,
        add_bos_token=True,
        add_eos_token=False,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))
    if len(fast) != len(tokens):
        raise ValueError(f"the tokenizer has {len(fast)} tokens, expected {len(tokens)}")
