"""What a rollout call returns: `RolloutOutputWithEntropy`, and its assembly.

Owns the output type (tunix's `RolloutOutput` plus entropy, routed experts and, with partial
rollouts, versions) and `assemble`, which fills it from a call's samples: the engine's
completions (`generate`, and `generate_groups` without partial rollouts) or a partial
rollout's kept samples (`partial.Member`). Rows align as docs/design.md section 4 says; the text
leaves out the held-back stop ids and ends before a matched stop string unless the call keeps
it (`completion_text`).

Must not ask the engine anything: the calls (`rollout_call`, `partial_call`) sample, this
module only lays out what they got.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.sampling.options import SamplingOptions
from sgl_jax_rollout.tunix_compat import RolloutOutput


@dataclasses.dataclass
class RolloutOutputWithEntropy(RolloutOutput):
    """tunix's `RolloutOutput` plus the per-token entropy of each sample (None if not asked)
    and, with `EngineSettings.return_routed_experts`, the experts each MoE layer routed each
    token to: `routed_experts[i]` `[len(tokens[i]), layers, top_k]`, aligned with the
    completion's tokens like its logprobs (row j: completion token j as the model's input;
    the last token is never an input, its row is -1), and `prompt_routed_experts[i]`
    `[prompt, layers, top_k]` for the sample's prompt tokens (unpadded)."""

    entropy: list[np.ndarray] | None = None
    routed_experts: list[np.ndarray] | None = None
    prompt_routed_experts: list[np.ndarray] | None = None
    # The policy version (`SglangJaxRollout.policy_version`) that sampled each token,
    # `[len(tokens[i])]`; its logprob is under that version. One version per completion but
    # with partial rollouts, whose continued samples span versions.
    versions: list[np.ndarray] | None = None
    # Why each completion ended, as sgl-jax reports it: "stop" (an EOS, a stop token or
    # string, a sampled pad), "length" (its max new tokens), "abort". None with partial
    # rollouts, whose samples end across calls.
    finish_reasons: list[str] | None = None


def completion_text(
    tokenizer: Any, tokens: Sequence[int], stops: set[int], trimmed: Sequence[str] = ()
) -> str:
    """A completion's text: its tokens decoded, the held-back stop ids left out, ended before
    the first of the `trimmed` stop strings it holds (as sgl-jax's detokenizer trims a matched
    stop string, `DetokenizerManager.trim_matched_stop`, `detokenizer_manager.py:101-117` at
    cddbf6f1; SGLang and vLLM do the same by default). A completion holds a stop string only
    where it ended there: the engine stops at the first it matches."""
    text = tokenizer.decode([t for t in tokens if t not in stops])
    ends = [i for i in (text.find(s) for s in trimmed) if i >= 0]
    return text[: min(ends)] if ends else text


def assemble(
    samples: list[Any],
    rows: list[list[int]],
    max_prompt: int,
    options: SamplingOptions,
    tokenizer: Any,
    stops: set[int],
    *,
    versions: bool = False,
) -> RolloutOutputWithEntropy:
    """The output of a call's `samples` (the engine's completions, each sampled under one
    weight version, or with `versions` a partial rollout's `Member`s, each token with the
    policy version that sampled it); `rows[i]` is the prompt ids of sample i. Routed experts
    come with completions that carry them."""
    if versions:
        extra = {"versions": [np.asarray(s.versions, np.int32) for s in samples]}
    else:
        extra = _routing(samples, [len(r) for r in rows])
        extra["versions"] = [np.full(len(s.tokens), s.weights_version, np.int32) for s in samples]
        extra["finish_reasons"] = [_reason(s.finish_reason) for s in samples]
    return RolloutOutputWithEntropy(
        text=[completion_text(tokenizer, s.tokens, stops, options.trimmed_stops) for s in samples],
        logits=None,
        tokens=[np.asarray(s.tokens, np.int32) for s in samples],
        left_padded_prompt_tokens=inputs.left_pad(rows, max_prompt, tokenizer.pad_id()),
        logprobs=_per_row(samples, "logprobs") if options.return_logprobs else None,
        entropy=_per_row(samples, "entropy") if options.return_entropy else None,
        **extra,
    )


def _reason(finish_reason: Any) -> str:
    """sgl-jax's finish reason (`{"type": "stop", ...}`, `Req.finished_reason.to_json()`) as
    its type."""
    if isinstance(finish_reason, dict):
        return str(finish_reason.get("type"))
    return str(finish_reason)


def _per_row(samples: list[Any], field: str) -> list[np.ndarray]:
    return [np.asarray(getattr(s, field), np.float32) for s in samples]


def _routing(completions: list[Any], prompt_lengths: list[int]) -> dict[str, Any]:
    """`routed_experts` and `prompt_routed_experts` of `RolloutOutputWithEntropy` from each
    completion's per-input-position routing (`Completion.routed_experts`); empty without it."""
    if not completions or completions[0].routed_experts is None:
        return {}
    tokens, prompts = [], []
    for c, length in zip(completions, prompt_lengths, strict=True):
        routed = c.routed_experts
        expected = length + len(c.tokens) - 1
        if routed.shape[0] != expected:
            raise RuntimeError(
                f"the engine returned routed experts for {routed.shape[0]} positions, expected "
                f"{expected} (prompt {length} + completion {len(c.tokens)} - 1)"
            )
        last = np.full((1, *routed.shape[1:]), -1, np.int32)  # never an input
        tokens.append(np.concatenate([routed[length:], last]))
        prompts.append(routed[:length])
    return {"routed_experts": tokens, "prompt_routed_experts": prompts}
