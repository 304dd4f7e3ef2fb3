"""The checks of every completion of `bench soak`, and the tally of what they find.

Owns `check_call` (every completion of one generate call) and `Tally` (completions, re-scored
rows, what ended each completion, bad counts by kind and the first failures). The checks:
- `lengths`: tokens, logprobs and entropy of one length, 1..max_tokens_to_generate;
- `values`: logprobs finite and <= 0, entropy finite and >= 0;
- `rescore`: where the request sampled at temperature 1 with nothing that reshapes the
  distribution (processed logprobs then equal raw ones), prefill re-scoring of the completion
  (`engine.score`) equals its logprobs within `RESCORE_ATOL`;
- `stop_token_inside`: no stop id (model EOS, `eos_tokens`, pad) before the last token;
- `stop_string_inside`: no stop string in the text of all tokens but the last;
- `early_end`: a completion shorter than max_tokens_to_generate ends with a stop id or a
  stop string; with `ignore_eos`, every completion has exactly max_tokens_to_generate tokens,
  or fewer ending at its first pad id (a sampled pad ends the row: tunix reads every pad as
  padding, `rollout_inputs.cut_at_pad`);
- `min_new_tokens`: no completion shorter than min_new_tokens (calls without stop strings);
- `stores`: the engine's per-request stores are empty after every call (`soak.run_on` reads
  them).

Must not fix or work around what it finds (it reports), or read the rollout's private state.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from sgl_jax_rollout import rollout_inputs as inputs
from sgl_jax_rollout.sampling.options import SamplingOptions

RESCORE_ATOL = 1e-4
BAD_KINDS = (
    "lengths",
    "values",
    "rescore",
    "stop_token_inside",
    "stop_string_inside",
    "early_end",
    "min_new_tokens",
    "stores",
)
MAX_FAILURES_LISTED = 10


class Tally:
    def __init__(self) -> None:
        self.completions = 0
        self.rescored = 0
        self.max_diff = 0.0
        self.prompt_lengths: list[int] = []
        self.ended_by: collections.Counter[str] = collections.Counter()
        self.bad_by_kind = dict.fromkeys(BAD_KINDS, 0)
        self.failures: list[dict[str, Any]] = []

    def bad(self, kind: str, call: int | None, row: int | None, detail: str) -> None:
        self.bad_by_kind[kind] += 1
        if len(self.failures) < MAX_FAILURES_LISTED:
            self.failures.append({"kind": kind, "call": call, "row": row, "detail": detail})


def check_call(rollout, tally: Tally, call_index: int, kind, config, out, stop_ids) -> None:
    options = inputs.options_for_call(SamplingOptions(), config, kind.overrides)
    tokenizer = rollout.engine.tokenizer
    prompts = inputs.prompt_rows(out.left_padded_prompt_tokens, rollout.pad_id())
    tally.prompt_lengths.extend(len(p) for p in prompts)
    tally.completions += len(out.tokens)
    where = f"{kind.name} (call {call_index})"
    rescorable = []
    for row, tokens in enumerate(out.tokens):
        tokens = np.asarray(tokens).tolist()
        logprobs = np.asarray(out.logprobs[row], np.float64)
        entropy = np.asarray(out.entropy[row], np.float64)
        if not (len(tokens) == len(logprobs) == len(entropy)) or not (
            1 <= len(tokens) <= config.max_tokens_to_generate
        ):
            tally.bad(
                "lengths",
                call_index,
                row,
                f"{where}: {len(tokens)} tokens, {len(logprobs)} logprobs, {len(entropy)} "
                f"entropies, max_tokens_to_generate {config.max_tokens_to_generate}",
            )
            continue
        if not (np.all(np.isfinite(logprobs)) and np.all(logprobs <= 1e-6)) or not (
            np.all(np.isfinite(entropy)) and np.all(entropy >= -1e-6)
        ):
            tally.bad("values", call_index, row, f"{where}: logprobs {logprobs} entropy {entropy}")
        ended = _ending(tally, call_index, row, where, tokens, options, stop_ids, tokenizer)
        if options.ignore_eos:
            full = len(tokens) == config.max_tokens_to_generate
            cut_at_pad = tokens[-1] == rollout.pad_id() and rollout.pad_id() not in tokens[:-1]
            tally.ended_by["length" if full else "pad"] += 1
            if not full and not cut_at_pad:
                tally.bad(
                    "early_end",
                    call_index,
                    row,
                    f"{where}: ignore_eos but {len(tokens)} tokens, not ended by a sampled pad "
                    f"id: {tokens[-4:]}",
                )
        elif len(tokens) < config.max_tokens_to_generate and ended == "length":
            tally.bad(
                "early_end",
                call_index,
                row,
                f"{where}: {len(tokens)} of {config.max_tokens_to_generate} tokens, no stop "
                f"id or stop string at the end: {tokens[-4:]}",
            )
        if not options.stop and len(tokens) < min(
            options.min_new_tokens, config.max_tokens_to_generate
        ):
            tally.bad(
                "min_new_tokens",
                call_index,
                row,
                f"{where}: {len(tokens)} tokens, min_new_tokens {options.min_new_tokens}",
            )
        if _rescorable(options):
            rescorable.append(row)
    if not rescorable:
        return
    scores = rollout.engine.score(
        [prompts[r] for r in rescorable], [np.asarray(out.tokens[r]).tolist() for r in rescorable]
    )
    for row, score in zip(rescorable, scores, strict=True):
        logprobs = np.asarray(out.logprobs[row], np.float64)
        tally.rescored += 1
        if len(score) != len(logprobs):
            tally.bad(
                "rescore",
                call_index,
                row,
                f"{where}: {len(score)} scores for {len(logprobs)} logprobs",
            )
            continue
        diff = float(np.max(np.abs(np.asarray(score, np.float64) - logprobs)))
        tally.max_diff = max(tally.max_diff, diff)
        if not diff <= RESCORE_ATOL:
            position = int(np.argmax(np.abs(np.asarray(score, np.float64) - logprobs)))
            tally.bad(
                "rescore",
                call_index,
                row,
                f"{where}: |rescored - sampled logprob| {diff:.3g} at position {position} "
                f"of {len(logprobs)} (prompt {len(prompts[row])} tokens)",
            )


def _ending(tally, call_index, row, where, tokens, options, stop_ids, tokenizer) -> str:
    """Checks stop ids and stop strings inside a completion; returns what ended it."""
    if options.ignore_eos:  # `check_call` tells a length end from a sampled pad's
        return "length"
    inside = [(i, t) for i, t in enumerate(tokens[:-1]) if t in stop_ids]
    if inside:
        tally.bad(
            "stop_token_inside",
            call_index,
            row,
            f"{where}: stop id {inside[0][1]} at position {inside[0][0]} of {len(tokens)}",
        )
    head = tokenizer.decode(tokens[:-1])
    found = [s for s in options.stop if s in head]
    if found:
        tally.bad(
            "stop_string_inside",
            call_index,
            row,
            f"{where}: stop string {found[0]!r} before the last token: {head!r}",
        )
    if tokens[-1] in stop_ids:
        ended = "stop_token"
    elif any(s in tokenizer.decode(tokens) for s in options.stop):
        ended = "stop_string"
    else:
        ended = "length"
    tally.ended_by[ended] += 1
    return ended


def _rescorable(options: SamplingOptions) -> bool:
    """Processed logprobs equal the model's raw log-softmax: temperature 1, nothing cut or
    penalised, no stop id masked by min_new_tokens."""
    return (
        options.return_logprobs
        and options.logprobs_mode == "processed"
        and options.temperature == 1.0
        and options.top_k == -1
        and options.top_p == 1.0
        and options.min_p == 0.0
        and options.repetition_penalty == 1.0
        and options.frequency_penalty == 0.0
        and options.presence_penalty == 0.0
        and options.min_new_tokens == 0
    )
