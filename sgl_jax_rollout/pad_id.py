"""The pad id the rollout hands tunix: an id that never occurs inside a prompt or a completion.

tunix builds its masks and positions from the pad id (`prompt_ids != pad_id` in every learner
and in its vanilla sampler): a prompt token equal to it is masked out of attention and shifts
the positions after it, so the trainer scores another sequence than the engine sampled from.
Real checkpoints often ship pad = EOS (SmolLM2: `<|im_end|>`, which closes every chat turn, so
every chat prompt holds it) or no pad at all (Llama 3; tunix's `TokenizerAdapter` then falls back
to EOS, `<|eot_id|>`, which also closes every turn). Measured on SmolLM2-135M-Instruct with pad
= EOS: trainer / rollout max |logprob difference| 1.12 nats on chat prompts, 2.9e-5 without.

Owns `choose_pad_id` and `PadSafeTokenizer`. The pad id is, in this order:

1. `pad_id=` given by the user (checked: in the vocabulary, not a stop id);
2. the tokenizer's own pad, when it is no stop id (the model's EOS ids), not BOS or UNK, and
   not a special token the chat template writes;
3. else the first id past the tokenizer's vocabulary where the model's vocabulary is larger
   (embedding rows no text can produce; the engine's sampler never samples them): Qwen;
4. else the highest-id special token of the tokenizer that is none of those (SmolLM2:
   `<empty_output>`, 16; Llama 3: its last `<|reserved_special_token_N|>`);
5. else ValueError: pass `pad_id=`.

In cases 2 and 4 a text can still spell the token; `SglangJaxRollout.generate` then refuses
that prompt by name, and `check` has a row for it. A completion never holds the pad before its
end: it is a stop id of every request (`RequestPolicy.stop_rules`), and a sampled one (with
`ignore_eos` too) ends the completion there (`rollout_inputs.cut_at_pad`).

`PadSafeTokenizer` is tunix's `TokenizerAdapter` with that pad id: give it to tunix's cluster
(and so to `VanillaRollout`, whose sampler reads the tokenizer's pad) as `build_cluster` does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from sgl_jax_rollout.tunix_compat import TokenizerAdapter

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PadChoice:
    id: int
    token: str | None  # its text, where the tokenizer has one
    why: str  # a sentence for logs and `check`


def choose_pad_id(
    tokenizer: Any, vocab_size: int, stop_ids: Iterable[int], pad_id: int | None = None
) -> PadChoice:
    """The pad id for `tokenizer` (an HF tokenizer, or anything with tunix's tokenizer methods)
    serving a model of `vocab_size` whose completions stop at `stop_ids`."""
    stops = {int(i) for i in stop_ids}
    if pad_id is not None:
        if not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id must be an integer in [0, {vocab_size}), got {pad_id!r}")
        if pad_id in stops:
            raise ValueError(
                f"pad_id must not be a stop id of the model ({sorted(stops)}), got {pad_id}"
            )
        return PadChoice(pad_id, _text(tokenizer, pad_id), "given as pad_id")
    excluded = stops | _ids_of(tokenizer, "eos_token_id", "bos_token_id", "unk_token_id")
    template = _template_text(tokenizer)
    own = _own_pad(tokenizer)
    if own is not None:
        text = _text(tokenizer, own)
        if own not in excluded and not (text and text in template):
            return PadChoice(own, text, "the tokenizer's own pad")
        reason = "a stop id" if own in stops else "a token prompts hold"
        why = f"the tokenizer's pad {text!r} ({own}) is {reason}"
    else:
        why = "the tokenizer has no pad"
    length = len(tokenizer) if hasattr(tokenizer, "__len__") else vocab_size
    if length < vocab_size:
        return PadChoice(length, None, f"{why}; the first id past the tokenizer's {length} tokens")
    for candidate in sorted(_special_ids(tokenizer), reverse=True):
        text = _text(tokenizer, candidate)
        if candidate not in excluded and candidate < vocab_size and (text or "") not in template:
            return PadChoice(candidate, text, f"{why}; an unused special token")
    raise ValueError(
        f"no pad id that prompts and completions cannot hold: {why}, the model's vocabulary "
        f"({vocab_size}) has no id past the tokenizer's, and every special token is used; "
        "pass pad_id= (an id no prompt contains)"
    )


class PadSafeTokenizer(TokenizerAdapter):
    """tunix's `TokenizerAdapter` whose `pad_id()` is `choose_pad_id`'s; everything else is
    the wrapped tokenizer's (EOS stays EOS)."""

    def __init__(self, tokenizer: Any, choice: PadChoice) -> None:
        super().__init__(tokenizer)
        self.pad_choice = choice

    def pad_id(self) -> int:
        return self.pad_choice.id


def pad_safe(
    tokenizer: Any, vocab_size: int, stop_ids: Iterable[int], pad_id: int | None = None
) -> PadSafeTokenizer:
    """`tokenizer` (raw, or tunix's adapters of it) with a safe pad id; one already made safe,
    without a `pad_id` that differs, is returned as is (tunix's cluster wraps the tokenizer it
    is given in an adapter of its own before handing it to the rollout)."""
    while isinstance(tokenizer, TokenizerAdapter) and not isinstance(tokenizer, PadSafeTokenizer):
        tokenizer = tokenizer.tokenizer
    if isinstance(tokenizer, PadSafeTokenizer) and pad_id in (None, tokenizer.pad_id()):
        return tokenizer
    raw = tokenizer.tokenizer if isinstance(tokenizer, TokenizerAdapter) else tokenizer
    choice = choose_pad_id(raw, vocab_size, stop_ids, pad_id)
    log.info("pad id %d (%r): %s", choice.id, choice.token, choice.why)
    return PadSafeTokenizer(raw, choice)


def _own_pad(tokenizer: Any) -> int | None:
    if hasattr(tokenizer, "pad_token_id"):  # HF: read it, never set it (tunix's adapter does)
        return tokenizer.pad_token_id
    pad = tokenizer.pad_id()
    return None if pad is None or pad < 0 else int(pad)


def _ids_of(tokenizer: Any, *names: str) -> set[int]:
    return {int(i) for i in (getattr(tokenizer, n, None) for n in names) if i is not None}


def _special_ids(tokenizer: Any) -> list[int]:
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return [int(i) for i, token in added.items() if getattr(token, "special", False)]


def _text(tokenizer: Any, token_id: int) -> str | None:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    return convert(int(token_id)) if convert is not None else None


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, dict) else str(template)
