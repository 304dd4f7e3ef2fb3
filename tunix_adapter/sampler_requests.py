"""One request of tunix main's `Sampler.sample` as our rollout serves it.

Owns `RowRequest` (a request's prompt ids, its `RolloutConfig`, whether it returns logprobs),
`row_request`, which makes one from a `SamplingRequest` or a bare prompt with every check made
before the engine is touched, and `response` / `error_response` / `cancelled_response`, the
`SamplingResponse` of its output, its failure or its cancel.

Prompts, as tunix's adapters take them (`tunix/experimental/rollout/
inprocess_vllm_sampler_adapter.py` at c7d8950f): a string (encoded as `generate` encodes it:
one BOS where the tokenizer has one; never cut), token ids (used as given) or chat messages
(the tokenizer's chat template, with the generation prompt). A request's `SamplingParams`
(tunix's defaults where it has none, as its adapters do) set the `RolloutConfig` fields of the
same meaning: `max_tokens` -> `max_tokens_to_generate`, `temperature`, `top_p`, `top_k`,
`seed`. Beam search and logits are refused by name: the engine samples, and returns each
token's logprob.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sgl_jax_rollout import tunix_compat

# sgl-jax's finish reasons (`{"type": ...}`) in tunix's (`SamplingResponse.finish_reason`).
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


@dataclasses.dataclass(frozen=True)
class RowRequest:
    request_id: str
    prompt_ids: list[int]
    config: Any  # tunix's RolloutConfig
    return_logprobs: bool


def row_request(
    request: Any,
    defaults: Any,
    encode: Callable[[str], list[int]],
    chat: Callable[[list[dict[str, Any]]], list[int]],
    return_logprobs: bool,
) -> RowRequest:
    """`request`: a `SamplingRequest`, or a bare prompt; `defaults`: the sampler's
    `RolloutConfig` (what `SamplingParams` does not set: `max_prompt_length`, penalties...);
    `return_logprobs`: `sample(..., return_logprobs=True)`, which asks it of every request.
    Raises ValueError / TypeError naming the field at fault."""
    params = getattr(request, "sampling_params", None) or tunix_compat.TunixSamplingParams()
    if getattr(params, "beam_size", None) is not None:
        raise ValueError(
            f"sampling_params.beam_size must be None, got {params.beam_size}: "
            "SglangJaxSampler samples (no beam search)"
        )
    if getattr(params, "return_logits", False):
        raise ValueError(
            "sampling_params.return_logits must be False: SglangJaxSampler returns each "
            "sampled token's logprob (return_logprobs), not logits"
        )
    max_tokens = params.max_tokens
    if not isinstance(max_tokens, numbers.Integral) or isinstance(max_tokens, bool):
        raise TypeError(f"sampling_params.max_tokens must be an integer, got {max_tokens!r}")
    if max_tokens < 1:
        raise ValueError(f"sampling_params.max_tokens must be >= 1, got {max_tokens}")
    config = dataclasses.replace(
        defaults,
        max_tokens_to_generate=int(max_tokens),
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        return_logprobs=True,  # computed in the sampling pass anyway; returned when asked
    )
    prompt = getattr(request, "prompt", request)
    return RowRequest(
        request_id=str(getattr(request, "request_id", "") or ""),
        prompt_ids=prompt_ids(prompt, encode, chat),
        config=config,
        return_logprobs=bool(params.return_logprobs or return_logprobs),
    )


def prompt_ids(
    prompt: Any,
    encode: Callable[[str], list[int]],
    chat: Callable[[list[dict[str, Any]]], list[int]],
) -> list[int]:
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, np.ndarray) and np.issubdtype(prompt.dtype, np.integer):
        if prompt.ndim != 1:
            raise ValueError(f"a token-id prompt must be 1-D, got shape {prompt.shape}")
        return [int(t) for t in prompt]
    if isinstance(prompt, Sequence) and prompt:
        if all(isinstance(m, dict) for m in prompt):
            return chat(list(prompt))
        if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            return [int(t) for t in prompt]
    raise TypeError(
        "prompt must be a string, token ids (a 1-D integer sequence) or chat messages (a "
        f"list of dicts with role and content), got {_describe(prompt)}"
    )


def response(row: RowRequest, output: Any, policy_version: int) -> Any:
    """The `SamplingResponse` of `output` (our rollout's one-row output for `row`), sampled
    under `policy_version` (the weight-sync round's version that sampled it)."""
    tokens = np.asarray(output.tokens[0], np.int32)
    logprobs = np.asarray(output.logprobs[0], np.float32) if row.return_logprobs else None
    reason = output.finish_reasons[0] if output.finish_reasons else "stop"
    return tunix_compat.SamplingResponse(
        request_id=row.request_id,
        text=output.text[0],
        prompt_token_ids=np.asarray(row.prompt_ids, np.int32),
        token_ids=tokens,
        logprobs=logprobs,
        finish_reason=FINISH_REASONS.get(reason, reason),
        routed_experts=_routed_experts(output),
        metadata={
            "policy_version": policy_version,
            "weights_version": int(output.versions[0][0]) if len(tokens) else None,
        },
    )


def _routed_experts(output: Any) -> np.ndarray | None:
    """tunix's `[batch, layers, length, top_k]` from the engine's routing of every input
    position of prompt + completion (row j: the experts of token j as the model's input; the
    last token is never an input, its row is -1); None unless the engine returns them
    (`EngineSettings.return_routed_experts`: tunix's `SamplingParams` has no field asking)."""
    if output.routed_experts is None:
        return None
    positions = np.concatenate([output.prompt_routed_experts[0], output.routed_experts[0]])
    return positions.transpose(1, 0, 2)[None]


def error_response(request: Any, error: BaseException, ids: list[int] | None) -> Any:
    """The `SamplingResponse` of a request that failed: `finish_reason` "error", `error` its
    exception's type and message; the other requests of the call are unaffected."""
    return tunix_compat.SamplingResponse(
        request_id=str(getattr(request, "request_id", "") or ""),
        prompt_token_ids=np.asarray(ids or [], np.int32),
        finish_reason="error",
        error=tunix_compat.ErrorInfo(error_type=type(error).__name__, message=str(error)),
    )


def cancelled_response(request: Any, reason: str, ids: list[int] | None) -> Any:
    """The `SamplingResponse` of a request cancelled while it sampled (the sampler stopped,
    or the caller's task cancelled): `finish_reason` "cancelled", the reason in `error`."""
    response = error_response(request, RuntimeError(reason), ids)
    response.finish_reason = "cancelled"
    response.error = tunix_compat.ErrorInfo(error_type="Cancelled", message=reason)
    return response


def _describe(prompt: Any) -> str:
    if isinstance(prompt, (list, tuple)):
        kinds = sorted({type(p).__name__ for p in prompt})
        return f"a {type(prompt).__name__} of {', '.join(kinds) or 'nothing'}"
    return type(prompt).__name__
