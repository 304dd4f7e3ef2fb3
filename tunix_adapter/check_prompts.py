"""The pre-flight's prompts: long, of different lengths, chat conversations where possible.

Owns `long_prompts` (what every check samples from) and the text they are made of
(`SENTENCE`, `CHAT_OPENING`). Where the tokenizer has a chat template every prompt is a chat
conversation, so every turn-closing token is in it (the pad check needs them).
"""

from __future__ import annotations

SENTENCE = "the quick brown fox jumps over the lazy dog while we check every number. "


def long_prompts(tokenizer, count: int, tokens: int) -> list[str]:
    """`count` different prompts, the first of about `tokens` tokens (cut to `tokens + 16`),
    each next one shorter by a quarter of that over `count` (so a batch of them is left-padded):
    chat conversations where the tokenizer has a chat template (`CHAT_OPENING`, then the text
    as the last user turn), plain text otherwise."""
    opening = _chat(tokenizer, "")
    overhead = len(tokenizer.encode(opening, add_special_tokens=False)) if opening else 0
    length = max(1, tokens - overhead)
    step = length // (4 * count)
    per_sentence = len(tokenizer.encode(SENTENCE, add_special_tokens=False))
    repeats = (length + count) // per_sentence + 2
    ids = tokenizer.encode(SENTENCE * repeats, add_special_tokens=False)
    texts = [tokenizer.decode(ids[i : i + max(1, length - i * step)]) for i in range(count)]
    return [_chat(tokenizer, text) or text for text in texts]


CHAT_OPENING = [
    {"role": "system", "content": "You check numbers."},
    {"role": "user", "content": "Say yes."},
    {"role": "assistant", "content": "yes"},
]


def _chat(tokenizer, text: str) -> str | None:
    """`text` as the last user turn of `CHAT_OPENING` in the tokenizer's chat template (None
    without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [*CHAT_OPENING, {"role": "user", "content": text}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja2's TemplateError, raised by the template itself
        if "system" not in str(err).lower():
            raise
    # A template without a system role (Gemma's): the system text opens the first user turn,
    # as Gemma's model card does it.
    system, first, *rest = messages
    folded = {"role": "user", "content": system["content"] + "\n\n" + first["content"]}
    return tokenizer.apply_chat_template(
        [folded, *rest], tokenize=False, add_generation_prompt=True
    )
