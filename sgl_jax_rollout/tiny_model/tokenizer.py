"""The built-in byte-level BPE tokenizer, trained in code on a generated corpus.

Owns the tokenizer of the built-in tiny model: special tokens (distinct pad / bos / eos, chat
markers, `<think>` / `</think>`), a Qwen-style chat template, and a deterministic corpus that
includes multi-byte characters (so byte-level pieces that end mid-character occur); and the
Gemma vocabulary's special tokens at Gemma's own ids (`GEMMA`: `<pad>` 0, `<eos>` 1, `<bos>` 2,
`<unk>` 3, `<start_of_turn>` 106, `<end_of_turn>` 107; placeholders between), its chat template
(no system role, `model` for the assistant) and its BOS added to every encoded text; Gemma 3's
(`GEMMA3`: `<mask>` 4, `<start_of_turn>` 105, `<end_of_turn>` 106, a system turn folded into the
first user turn); and Gemma 4's (`GEMMA4`: its control tokens at their ids, `<|turn>` 105 and
`<turn|>` 106, a system role). `filled` widens a trained tokenizer to a checkpoint's length
with entries no text encodes to (the Gemma 3 replica's 262,144).
Nothing is downloaded.

Must not touch model weights.
"""

from __future__ import annotations

import dataclasses
import json
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|im_end|>"
IM_START, THINK_START, THINK_END = "<|im_start|>", "<think>", "</think>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, THINK_START, THINK_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# google/gemma-2-2b-it tokenizer_config.json's chat template.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A family's special tokens (in id order, first in the vocabulary) and their roles."""

    special_tokens: tuple[str, ...]
    pad: str
    bos: str
    eos: str
    additional: tuple[str, ...]  # the tokenizer's additional_special_tokens
    chat_template: str
    add_bos: bool = False  # every encoded text starts with bos (Gemma's tokenizer)
    end_of_turn: str | None = None  # an EOS the generation config lists beside `eos`


QWEN_STYLE = Vocabulary(
    special_tokens=tuple(SPECIAL_TOKENS),
    pad=PAD,
    bos=BOS,
    eos=EOS,
    additional=(IM_START, THINK_START, THINK_END),
    chat_template=CHAT_TEMPLATE,
)
# Gemma 2's ids 4..105 hold <mask>, <2mass>, [@BOS@] and <unused0..98>: placeholders here.
GEMMA = Vocabulary(
    special_tokens=(
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        *(f"<unused{i}>" for i in range(102)),
        "<start_of_turn>",
        "<end_of_turn>",
    ),
    pad="<pad>",
    bos="<bos>",
    eos="<eos>",
    additional=("<start_of_turn>", "<end_of_turn>"),
    chat_template=GEMMA_CHAT_TEMPLATE,
    add_bos=True,
    end_of_turn="<end_of_turn>",
)

# google/gemma-3-1b-it's plain chat as its official template renders it (a system message
# opens the first user turn; the template's image items are left out).
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}"
    "{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# google/gemma-4-31B-it's plain chat as its official template renders it (a system turn
# allowed, `model` for the assistant, `<|turn>` / `<turn|>` around each turn); the official
# template's tool, thinking and media blocks are left out.
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<|turn>' + role + '\\n' + message['content'] | trim + '<turn|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}"
)


def _placed(named: dict[int, str], size: int) -> tuple[str, ...]:
    """Special tokens at their checkpoint ids, `<unusedK>` placeholders between."""
    return tuple(named.get(i, f"<unused{i}>") for i in range(size))


# Gemma 3's special tokens at google/gemma-3-1b-it's ids (0..106).
GEMMA3 = Vocabulary(
    special_tokens=_placed(
        {
            0: "<pad>",
            1: "<eos>",
            2: "<bos>",
            3: "<unk>",
            4: "<mask>",
            105: "<start_of_turn>",
            106: "<end_of_turn>",
        },
        107,
    ),
    pad="<pad>",
    bos="<bos>",
    eos="<eos>",
    additional=("<start_of_turn>", "<end_of_turn>"),
    chat_template=GEMMA3_CHAT_TEMPLATE,
    add_bos=True,
    end_of_turn="<end_of_turn>",
)

# Gemma 4's control tokens at google/gemma-4-31B-it's ids (0..106).
GEMMA4 = Vocabulary(
    special_tokens=_placed(
        {
            0: "<pad>",
            1: "<eos>",
            2: "<bos>",
            3: "<unk>",
            4: "<mask>",
            46: "<|tool>",
            47: "<tool|>",
            48: "<|tool_call>",
            49: "<tool_call|>",
            50: "<|tool_response>",
            51: "<tool_response|>",
            52: '<|"|>',
            98: "<|think|>",
            100: "<|channel>",
            101: "<channel|>",
            105: "<|turn>",
            106: "<turn|>",
        },
        107,
    ),
    pad="<pad>",
    bos="<bos>",
    eos="<eos>",
    additional=("<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool_call>"),
    chat_template=GEMMA4_CHAT_TEMPLATE,
    add_bos=True,
    end_of_turn="<turn|>",
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


def filled(tokenizer: Tokenizer, size: int) -> Tokenizer:
    """`tokenizer` with `size` entries: each id from its length on is `<unusedK>` (K the id),
    an entry of the BPE vocabulary that its merges never produce, so encoding is unchanged and
    every id decodes (to its own name), as in a checkpoint whose vocabulary is that wide."""
    have = tokenizer.get_vocab_size()
    if size < have:
        raise ValueError(f"size must be >= the tokenizer's {have} entries, got {size}")
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for token_id in range(have, size):
        name = f"<unused{token_id}>"
        if name in vocab:
            raise ValueError(f"{name} is already in the vocabulary at {vocab[name]}")
        vocab[name] = token_id
    return Tokenizer.from_str(json.dumps(data))


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


def train_tokenizer(vocab_size: int, seed: int, vocabulary: Vocabulary = QWEN_STYLE) -> Tokenizer:
    """A byte-level BPE with `vocab_size` entries, the vocabulary's special tokens first (ids
    0..5 for the built-in one)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(vocabulary.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(seed), trainer=trainer)
    if vocabulary.add_bos:
        bos = vocabulary.bos
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tokenizer.token_to_id(bos))],
        )
    return tokenizer
