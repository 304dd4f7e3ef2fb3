"""Managed multi-turn sessions: tokens, masks, logprobs and entropy (and a MoE's routed
experts) that stay aligned.

Owns `Session` and `Node`. A session tracks sequences as nodes; a request whose prompt
begins with a node's tokens (or, for text, with the node's `full_text`) extends that node:
only the new suffix is tokenised, and the sampled tokens of earlier turns are never
re-tokenised. Per docs/design.md section 4, prompt and environment positions hold -100 in
`masked_tokens`, 1.0 in `logprobs` and 0.0 in `entropy`; sampled positions hold the token, its
logprob and its entropy. Default mode replaces the extended node; tree mode (`track_tree`)
keeps every node, keyed and linked to its parent. `n > 1` branches into n nodes.

A prompt that extends no node (while the session tracks one) starts a new root node: its
earlier sampled tokens are re-tokenised and masked as prompt. That is what happens when a chat
is re-rendered from text and the text differs from what was sampled (Qwen3's template drops
earlier <think> blocks; a reply decoded with skip_special_tokens=True), so it logs a WARNING
naming the closest node and the first differing character (or token); `strict=True` raises
ValueError instead. `chat_extend(node, new_messages)` extends a node by token ids, so it cannot
mismatch. Token-id prompts are checked against `vocab_size` before the engine is called. A
root node's prompt passes through `start` first (the rollout's: exactly one BOS where the
tokenizer has one, so a plain-text prompt to Gemma or Llama gets the BOS its chat template
would have written). A chat template that refuses the messages (Gemma's has no system role and
wants user and assistant turns alternating) raises ValueError with the template's reason.

The engine is reached through one callable, `sample(prompt_ids, n, overrides)`, which
returns n `Sampled` completions; `SglangJaxRollout.session()` passes its own.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

MASK_ID = -100
PROMPT_LOGPROB = 1.0
PROMPT_ENTROPY = 0.0
CHAT_ROLES = ("system", "user", "assistant", "tool")
# chat_extend renders new messages after this conversation and keeps what follows its reply.
REFERENCE_REPLY = "REFERENCE_REPLY"
REFERENCE_CHAT = [
    {"role": "user", "content": "REFERENCE_QUERY"},
    {"role": "assistant", "content": REFERENCE_REPLY},
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """One completion of the engine: tokens with one logprob and one entropy each; with a MoE
    served with `return_routed_experts`, the experts of the whole sequence, prompt then
    tokens (`[len(prompt) + len(tokens), layers, top_k]`, the last row -1)."""

    tokens: list[int]
    logprobs: list[float]
    entropy: list[float]
    finish_reason: str
    routed_experts: Any = None

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.logprobs) == len(self.entropy):
            raise ValueError(
                f"a completion needs one logprob and one entropy per token: {len(self.tokens)} "
                f"tokens, {len(self.logprobs)} logprobs, {len(self.entropy)} entropies"
            )


@dataclasses.dataclass
class Node:
    key: str
    parent: str | None
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    entropy: list[float]
    full_text: str
    metadata: dict[str, Any]
    # a MoE served with `return_routed_experts`: each token's experts `[len(tokens), layers,
    # top_k]` (the last token's row -1: it was never an input)
    routed_experts: Any = None

    def assistant_mask(self) -> list[bool]:
        return [t != MASK_ID for t in self.masked_tokens]


Sampler = Callable[[list[int], int, dict[str, Any]], Sequence[Sampled]]


class Session:
    """Use as a context manager (`with rollout.session() as s:`); see the module docstring."""

    def __init__(
        self,
        sample: Sampler,
        tokenizer: Any,
        track_tree: bool = False,
        strict: bool = False,
        vocab_size: int | None = None,
        start: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        self._sample = sample
        self._start = start or list
        self._tokenizer = tokenizer
        self.track_tree = track_tree
        self.strict = strict  # a prompt that extends no node raises instead of warning
        self.vocab_size = vocab_size
        self._nodes: dict[str, Node] = {}
        self._leaves: list[str] = []  # nodes a new request may extend, oldest first
        self._keys = itertools.count()
        self._open = False
        self._closed = False

    def __enter__(self) -> Session:
        if self._closed:
            raise RuntimeError("this session has ended; open a new one with rollout.session()")
        self._open = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open = False
        self._closed = True

    # Requests.
    def complete(self, prompt: str | Sequence[int], n: int = 1, **overrides: Any) -> list[Node]:
        """Samples n continuations of `prompt` (text or token ids); returns their nodes."""
        self._check_request(n)
        if not isinstance(prompt, str):
            prompt = self._token_ids(prompt)
        parent, prefix, suffix = self._match(prompt)
        return self._extend(parent, prefix, suffix, n, overrides)

    def chat(self, messages: Sequence[dict[str, str]], n: int = 1, **overrides: Any) -> list[Node]:
        """`complete` on the tokenizer's chat template of `messages` (generation prompt added)."""
        self._check_request(n)
        self._check_chat(messages)
        text = self._render(list(messages), add_generation_prompt=True)
        return self.complete(text, n=n, **overrides)

    def chat_extend(
        self,
        node_or_key: Node | str,
        messages: Sequence[dict[str, str]],
        n: int = 1,
        **overrides: Any,
    ) -> list[Node]:
        """Extends a leaf node by `messages`, only the new ones (a tool result, a user turn), by
        token ids, so it cannot mismatch: the node's tokens, the end of the assistant turn the
        chat template writes and the reply did not end with (ChatML's '\\n' after '<|im_end|>'),
        then the new messages as the template renders them, generation prompt included. The
        way to continue a chat whose template rewrites earlier turns (Qwen3 drops <think>)."""
        self._check_request(n)
        node = self._leaf(node_or_key)
        self._check_chat(messages)
        turn_end, new_ids = self._render_after_reply(messages)
        # the sampled reply usually ends with the start of turn_end already (its EOS)
        ends = (k for k in range(len(turn_end), 0, -1) if node.tokens[-k:] == turn_end[:k])
        done = next(ends, 0)
        return self._extend(node, list(node.tokens), turn_end[done:] + new_ids, n, overrides)

    def _extend(
        self,
        parent: Node | None,
        prefix: list[int],
        suffix: list[int],
        n: int,
        overrides: dict[str, Any],
    ) -> list[Node]:
        if not prefix + suffix:
            raise ValueError("the prompt is empty")
        if parent is None:
            suffix = self._start(suffix)
        prompt_ids = prefix + suffix
        samples = list(self._sample(prompt_ids, n, dict(overrides)))
        if len(samples) != n:
            raise RuntimeError(f"the engine returned {len(samples)} completions for n={n}")
        # Default mode extends the node in place (same key; n > 1 branches into new keys) and
        # forgets it; tree mode keeps it as the parent of the new nodes.
        keep_key = parent is not None and not self.track_tree and n == 1
        nodes = [
            self._grow(parent, prefix, suffix, s, parent.key if keep_key else None) for s in samples
        ]
        if parent is not None:
            self._leaves.remove(parent.key)
            if not self.track_tree and not keep_key:
                del self._nodes[parent.key]
        self._leaves.extend(node.key for node in nodes)
        return nodes

    def state(self) -> dict[str, Node]:
        """Every tracked node by key (tree mode: the whole tree; default: the current nodes)."""
        return dict(self._nodes)

    def trajectories(self) -> list[dict[str, list]]:
        """Per leaf: token ids, assistant mask, and logprobs / entropy aligned with the tokens
        (what tunix's agentic learner and our GRPO path consume)."""
        return [
            {
                "key": node.key,
                "token_ids": list(node.tokens),
                "assistant_mask": node.assistant_mask(),
                "logprobs": list(node.logprobs),
                "entropy": list(node.entropy),
                **({} if node.routed_experts is None else {"routed_experts": node.routed_experts}),
            }
            for node in (self._nodes[k] for k in self._leaves)
        ]

    # Checks.
    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError(
                "this session is not open: use it inside `with rollout.session() as s:`"
            )

    def _check_request(self, n: int) -> None:
        self._check_open()
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")

    def _check_chat(self, messages: Sequence[dict[str, str]]) -> None:
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
                role = message.get("role") if isinstance(message, dict) else message
                raise ValueError(f"messages[{i}]: role must be one of {CHAT_ROLES}, got {role!r}")
        if not getattr(self._tokenizer, "chat_template", None):
            raise ValueError(
                "chat needs a tokenizer with a chat template; this one has none (use complete)"
            )

    def _token_ids(self, prompt: Sequence[int]) -> list[int]:
        """`prompt` as ints, each a token id of the vocabulary (checked before the engine)."""
        prompt, top = list(prompt), self.vocab_size
        ids = [_as_int(token) for token in prompt]
        for i, token in enumerate(ids):
            if token is None or token < 0 or (top is not None and token >= top):
                allowed = f"in [0, {top})" if top is not None else ">= 0"
                raise ValueError(
                    f"prompt[{i}] = {prompt[i]!r}: a token id must be an integer {allowed}"
                )
        return ids

    def _leaf(self, node_or_key: Node | str) -> Node:
        """The tracked leaf `node_or_key` names (a node or its key)."""
        key = node_or_key.key if isinstance(node_or_key, Node) else node_or_key
        if key not in self._nodes:
            raise ValueError(f"no node {key!r} in this session; its nodes: {list(self._nodes)}")
        node = self._nodes[key]
        stale = isinstance(node_or_key, Node) and node_or_key.tokens != node.tokens
        if key not in self._leaves or stale:
            raise ValueError(
                f"node {key!r} is not a current leaf (it has been extended since); extend one of "
                f"{self._leaves}, as the latest call returned it"
            )
        return node

    # Tracking.
    def _render_after_reply(self, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
        """(ids that end an assistant turn, ids of `messages` after it with the generation
        prompt), as the chat template renders them after REFERENCE_CHAT's reply."""
        if not messages:
            raise ValueError("chat_extend needs at least one new message")
        alone = self._render(REFERENCE_CHAT)
        full = self._render(REFERENCE_CHAT + list(messages), add_generation_prompt=True)
        if REFERENCE_REPLY not in alone or REFERENCE_REPLY not in full:
            raise ValueError("chat_extend needs a chat template that renders assistant replies")
        # Only what follows the reply must agree: Qwen3's template writes an empty <think> block
        # before the reply while it is the last message, so `alone` is no prefix of `full`.
        turn_end = alone[alone.index(REFERENCE_REPLY) + len(REFERENCE_REPLY) :]
        after = full[full.index(REFERENCE_REPLY) + len(REFERENCE_REPLY) :]
        if not after.startswith(turn_end):
            raise ValueError(
                f"chat_extend cannot use this chat template: it ends an assistant turn with "
                f"{turn_end!r} when the turn is last but with {after[: len(turn_end)]!r} when "
                "messages follow; extend by token ids: complete(node.tokens + new_ids)"
            )
        return self._encode(turn_end), self._encode(after[len(turn_end) :])

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The chat template's text of `messages`; a template that refuses them (its
        `raise_exception`) raises ValueError with its reason."""
        from jinja2 import TemplateError

        try:
            return self._tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except TemplateError as err:
            raise ValueError(f"the chat template refuses these messages: {err}") from None

    def _match(self, prompt: str | list[int]) -> tuple[Node | None, list[int], list[int]]:
        """(node extended or None, its tokens, the new prompt tokens after them)."""
        if isinstance(prompt, str):
            for key in reversed(self._leaves):
                node = self._nodes[key]
                if prompt.startswith(node.full_text):
                    return node, list(node.tokens), self._encode(prompt[len(node.full_text) :])
            self._no_match(prompt)
            return None, [], self._encode(prompt)
        extended = [
            self._nodes[key]
            for key in self._leaves
            if prompt[: len(self._nodes[key].tokens)] == self._nodes[key].tokens
        ]
        best = max(extended, key=lambda node: len(node.tokens), default=None)
        if best is None:
            self._no_match(prompt)
            return None, [], prompt
        return best, list(best.tokens), prompt[len(best.tokens) :]

    def _no_match(self, prompt: str | list[int]) -> None:
        """Warns (strict: raises) that `prompt` extends no node, unless none is tracked yet."""
        if not self._leaves:
            return
        text = isinstance(prompt, str)

        def seen(node: Node) -> str | list[int]:
            return node.full_text if text else node.tokens

        def shared(node: Node) -> int:
            pairs = enumerate(zip(seen(node), prompt, strict=False))
            return next((i for i, (a, b) in pairs if a != b), min(len(seen(node)), len(prompt)))

        closest = max((self._nodes[key] for key in reversed(self._leaves)), key=shared)
        at, width = shared(closest), 40 if text else 8
        message = (
            f"the prompt extends no node of this session: the closest, node {closest.key!r}, "
            f"differs from it at {'character' if text else 'token'} {at}: node has "
            f"{seen(closest)[at : at + width]!r} vs prompt has {prompt[at : at + width]!r}. "
            "Without strict=True it starts a new root node: the earlier sampled tokens are "
            "re-tokenised and masked as prompt. Extend by token ids instead: "
            "chat_extend(node, new_messages) or complete(node.tokens + new_ids)."
        )
        if self.strict:
            raise ValueError(message)
        logger.warning(message)

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _grow(
        self,
        parent: Node | None,
        prefix: list[int],
        suffix: list[int],
        s: Sampled,
        key: str | None,
    ) -> Node:
        base = parent or Node("", None, [], [], [], [], "", {"turns": [], "finish_reasons": []})
        start = len(prefix) + len(suffix)
        key = key or f"n{next(self._keys)}"
        node = Node(
            key=key,
            parent=parent.key if parent is not None and self.track_tree else None,
            tokens=prefix + suffix + list(s.tokens),
            masked_tokens=base.masked_tokens + [MASK_ID] * len(suffix) + list(s.tokens),
            logprobs=base.logprobs + [PROMPT_LOGPROB] * len(suffix) + list(map(float, s.logprobs)),
            entropy=base.entropy + [PROMPT_ENTROPY] * len(suffix) + list(map(float, s.entropy)),
            full_text="",
            metadata={
                "turns": base.metadata["turns"] + [(start, start + len(s.tokens))],
                "finish_reasons": base.metadata["finish_reasons"] + [s.finish_reason],
            },
            routed_experts=s.routed_experts,  # the whole sequence's, from this turn's request
        )
        node.full_text = self._tokenizer.decode(node.tokens, skip_special_tokens=False)
        self._nodes[key] = node
        return node


def _as_int(token: Any) -> int | None:
    """`token` as an int; None when it is no integer (a bool, numpy's included, is none)."""
    if isinstance(token, bool) or getattr(getattr(token, "dtype", None), "kind", "") == "b":
        return None
    try:
        return operator.index(token)
    except TypeError:
        return None
