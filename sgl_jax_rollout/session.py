"""Managed multi-turn sessions: tokens, masks, logprobs and entropy that stay aligned.

Owns `Session` and `Node`. A session tracks sequences as nodes; a request whose prompt
begins with a node's tokens (or, for text, with the node's `full_text`) extends that node:
only the new suffix is tokenised, and the sampled tokens of earlier turns are never
re-tokenised. Per docs/design.md section 4, prompt and environment positions hold -100 in
`masked_tokens`, 1.0 in `logprobs` and 0.0 in `entropy`; sampled positions hold the token, its
logprob and its entropy. Default mode replaces the extended node; tree mode (`track_tree`)
keeps every node, keyed and linked to its parent. `n > 1` branches into n nodes.

The engine is reached through one callable, `sample(prompt_ids, n, overrides)`, which
returns n `Sampled` completions; `SglangJaxRollout.session()` passes its own.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

MASK_ID = -100
PROMPT_LOGPROB = 1.0
PROMPT_ENTROPY = 0.0
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class Sampled:
    """One completion of the engine: tokens with one logprob and one entropy each."""

    tokens: list[int]
    logprobs: list[float]
    entropy: list[float]
    finish_reason: str

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

    def assistant_mask(self) -> list[bool]:
        return [t != MASK_ID for t in self.masked_tokens]


Sampler = Callable[[list[int], int, dict[str, Any]], Sequence[Sampled]]


class Session:
    """Use as a context manager (`with rollout.session() as s:`); see the module docstring."""

    def __init__(self, sample: Sampler, tokenizer: Any, track_tree: bool = False) -> None:
        self._sample = sample
        self._tokenizer = tokenizer
        self.track_tree = track_tree
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
        self._check_open()
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        parent, prefix, suffix = self._match(prompt)
        prompt_ids = prefix + suffix
        if not prompt_ids:
            raise ValueError("the prompt is empty")
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

    def chat(self, messages: Sequence[dict[str, str]], n: int = 1, **overrides: Any) -> list[Node]:
        """`complete` on the tokenizer's chat template of `messages` (generation prompt added)."""
        self._check_open()
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
                role = message.get("role") if isinstance(message, dict) else message
                raise ValueError(f"messages[{i}]: role must be one of {CHAT_ROLES}, got {role!r}")
        if not getattr(self._tokenizer, "chat_template", None):
            raise ValueError(
                "chat needs a tokenizer with a chat template; this one has none (use complete)"
            )
        text = self._tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )
        return self.complete(text, n=n, **overrides)

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
            }
            for node in (self._nodes[k] for k in self._leaves)
        ]

    # Tracking.
    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError(
                "this session is not open: use it inside `with rollout.session() as s:`"
            )

    def _match(self, prompt: str | Sequence[int]) -> tuple[Node | None, list[int], list[int]]:
        """(node extended or None, its tokens, the new prompt tokens after them)."""
        if isinstance(prompt, str):
            for key in reversed(self._leaves):
                node = self._nodes[key]
                if prompt.startswith(node.full_text):
                    return node, list(node.tokens), self._encode(prompt[len(node.full_text) :])
            return None, [], self._encode(prompt)
        ids = [int(t) for t in prompt]
        extended = [
            self._nodes[key]
            for key in self._leaves
            if ids[: len(self._nodes[key].tokens)] == self._nodes[key].tokens
        ]
        best = max(extended, key=lambda node: len(node.tokens), default=None)
        if best is None:
            return None, [], ids
        return best, list(best.tokens), ids[len(best.tokens) :]

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
        )
        node.full_text = self._tokenizer.decode(node.tokens, skip_special_tokens=False)
        self._nodes[key] = node
        return node
