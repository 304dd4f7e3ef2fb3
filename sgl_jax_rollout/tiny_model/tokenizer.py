"""The built-in byte-level BPE tokenizer, trained in code on a generated corpus.

Owns the tokenizer of the built-in tiny model: special tokens (distinct pad / bos / eos, chat
markers, `<think>` / `</think>`), a Qwen-style chat template, and a deterministic corpus that
includes multi-byte characters (so byte-level pieces that end mid-character occur).
Nothing is downloaded.

Must not touch model weights.
"""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|im_end|>"
IM_START, THINK_START, THINK_END = "<|im_start|>", "<think>", "</think>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, THINK_START, THINK_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = """
the a an of to in is it that was for on are with as be at by this have from or one had
not but what all were when we there can your which their said if do will each about how
up out them then she many some so these would other into has more her two like him see
time could no make than first been its who now people my made over did down only way
find use may water long little very after words called just where most know get through
back much before go good new write our used me man too any day same right look think
also around another came come work three word must because does part even place well
such answer number tool call function search result reward step plan check sum add five
seven
""".split()  # noqa: SIM905 (a word list reads better as text)
_EXTRA = ["café", "naïve", "über", "日本語", "中文", "Ελληνικά", "emoji 🙂", "→", "±0.5", "x²"]


def training_corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic pseudo-text: words, numbers, code-ish calls and multi-byte pieces."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), rng.choice(_EXTRA))
        if rng.random() < 0.2:
            words.append(f"call({rng.choice(_WORDS)}={rng.randint(0, 999)})")
        sentence = " ".join(words)
        out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ":"]))
    return out


def train_tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    """A byte-level BPE with `vocab_size` entries, special tokens first (ids 0..5)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(seed), trainer=trainer)
    return tokenizer
