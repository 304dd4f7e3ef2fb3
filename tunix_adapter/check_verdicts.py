"""The pre-flight's checks on a built trainer and rollout: `verdicts`, one row each.

Owns the measurements and limits of the checks `check.py`'s docstring lists (greedy tokens,
logprob fidelity, weight sync, alignment, LoRA, the pad id in prompts, MoE routing) and the
tolerances by engine dtype. It must not build or shut down trainer or engine (`check.run`
does).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tunix_adapter import check_exact
from tunix_adapter.check_config import CheckConfig, rollout_config
from tunix_adapter.check_prompts import long_prompts
from tunix_adapter.check_table import Verdict
from tunix_adapter.check_weights import lora_update_error, perturbed, small_adapters

F32_TOLERANCE = 1e-4
BF16_TOLERANCE = 0.1


def _greedy_agrees(tokens: np.ndarray, logits: np.ndarray, near_tie: float) -> np.ndarray:
    """Per position: the engine's greedy token is the trainer's argmax, or its trainer logprob
    is within `near_tie` nats of the argmax's (a near-tie that rounding decides)."""
    logits = logits.astype(np.float64)
    top = logits.max(-1)
    chosen = np.take_along_axis(logits, tokens[:, None], -1)[:, 0]
    return (tokens == logits.argmax(-1)) | (top - chosen <= near_tie)


def verdicts(
    config: CheckConfig,
    rollout,
    trainer,
    lora: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Verdict]:
    """Every check on an existing rollout and trainer model (`run` builds both). With `lora`,
    the trainer carries qwix adapters and the sync check sends only those, as tunix does.
    `progress` gets a line as each stage starts."""
    say = progress or (lambda line: None)
    from flax import nnx

    from tunix_adapter import routing_replay
    from tunix_adapter.scoring import before_pad, replays, trainer_logps, trainer_scores

    replay = replays(rollout, trainer)
    tolerance = BF16_TOLERANCE if engine_dtype(rollout) == "bfloat16" else F32_TOLERANCE
    limit = f"<= {tolerance:g}"
    prompts = long_prompts(rollout.engine.tokenizer, config.prompts, config.prompt_tokens)
    pad = rollout.pad_id()
    ids = rollout.prompt_token_ids(prompts, rollout_config(config, 1.0).max_prompt_length)
    pad_row = pad_in_prompts(ids, pad, rollout.engine.tokenizer.convert_ids_to_tokens(pad))
    if not pad_row.ok:
        return [pad_row]
    outputs = []
    rows_of = (
        f"{len(ids)} prompts of {'/'.join(str(len(i)) for i in ids)} tokens x {config.samples}"
    )

    valid = valid_ids(rollout)
    padded_gaps = []  # per sampled check: the trainer's largest log-mass on never-sampled ids
    gaps = []  # per sampled check: the mean |engine - trainer| logprob

    def fidelity(temperature: float) -> tuple:
        """(max |engine - trainer|, the output, the trainer's logprobs, each row's end)."""
        say(f"sampling and scoring at T={temperature:g} ({rows_of}, {config.max_tokens} new)")
        out = rollout.generate(prompts, rollout_config(config, temperature), n=config.samples)
        outputs.append(out)
        ends = [before_pad(t, pad) for t in out.tokens]
        if valid is None:
            reference = trainer_logps(rollout, trainer, out, temperature, replay)
        else:  # the engine samples from the tokenizer's ids: renormalise the trainer there
            reference, logits = trainer_scores(rollout, trainer, out, temperature, replay)
            gap = padded_log_mass(logits, valid)
            reference = reference + gap
            padded_gaps.append(
                max(float(g[:k].max(initial=0.0)) for g, k in zip(gap, ends, strict=True))
            )
        diffs = _gaps(out.logprobs, reference, ends)
        gaps.append(float(diffs.mean()) if diffs.size else 0.0)
        return float(diffs.max(initial=0.0)), out, reference, ends

    say(f"greedy tokens against the trainer's argmax ({rows_of}, {config.max_tokens} new)")
    greedy = rollout.generate(
        prompts, rollout_config(config, 1.0), temperature=0.0, n=config.samples
    )
    outputs.append(greedy)
    _, logits = trainer_scores(rollout, trainer, greedy, 1.0, replay)
    near_tie = 0.0 if tolerance == F32_TOLERANCE else tolerance
    logits = logits if valid is None else logits[..., :valid]
    agree = [
        _greedy_agrees(np.asarray(t)[:k], logits[i, :k], near_tie)
        for i, (t, k) in enumerate((t, before_pad(t, pad)) for t in greedy.tokens)
    ]
    share = float(np.mean(np.concatenate(agree)))
    need = 1.0 if tolerance == F32_TOLERANCE else 0.9
    rows = [
        Verdict(
            f"greedy tokens = trainer argmax (share, from {config.prompt_tokens})",
            share,
            f">= {need:g}",
            share >= need,
        )
    ]
    scored = {temperature: fidelity(temperature) for temperature in (1.0, 0.7)}
    floor_rows, floor = _floor(rollout, trainer, outputs[1], gaps[0], replay, say)
    exact = []  # the float64 reference, built at the first float32 row above the tolerance

    def judged(name: str, result: tuple, temperature: float) -> list[Verdict]:
        diff, out, reference, ends = result
        bound = fidelity_limit(tolerance, floor, temperature)
        if tolerance != F32_TOLERANCE or diff <= bound:
            return [Verdict(name, diff, f"<= {bound:.3g}", diff <= bound)]
        why = check_exact.unavailable(lora)
        if why:
            say(f"{name}: {diff:.3g} > {bound:g}; not scored in float64: {why}")
            return [Verdict(name, diff, f"<= {bound:.3g}", False)]
        say(f"{name}: {diff:.3g} > {bound:g}; scoring its rows with tunix's model in float64")
        if not exact:
            exact.append(check_exact.ExactReference(config.model_path, trainer, replay))
        truth = exact[0].logps(rollout, out, temperature, valid)
        off = float(_gaps(out.logprobs, truth, ends).max(initial=0.0))
        own = float(_gaps(list(reference), truth, ends).max(initial=0.0))
        # |engine - trainer| <= |engine - exact| + |trainer - exact|
        return [
            Verdict(name, diff, f"<= {bound + own:.3g}", diff <= bound + own),
            Verdict(
                f"exact: engine vs float64 model, T={temperature}",
                off,
                f"<= {bound:g}",
                off <= bound,
            ),
            Verdict(f"exact: trainer vs float64 model, T={temperature}", own, "reported", True),
        ]

    for temperature, each in scored.items():
        rows += judged(f"logprob |diff| vs trainer, T={temperature}", each, temperature)
    rows += floor_rows
    if replay:
        flipped = float(
            routing_replay.own_routing_mismatch(
                trainer, outputs[1], rollout.pad_id(), rollout.eos_id()
            ).max()
        )
        exact = tolerance == F32_TOLERANCE
        rows.append(
            Verdict(
                "MoE: positions routed otherwise without replay",
                flipped,
                "== 0" if exact else "reported",
                flipped == 0 or not exact,
            )
        )

    kind = nnx.LoRAParam if lora else nnx.Param
    say("update_params with perturbed " + ("LoRA adapters" if lora else "weights"))
    state = nnx.state(trainer, kind)
    nnx.update(trainer, perturbed(state, scale=0.05, seed=config.seed + 1))
    rollout.update_params(nnx.state(trainer, kind), (kind,))
    what = "LoRA adapters" if lora else "weights"
    rows += judged(f"after update_params (perturbed {what}), T=1.0", fidelity(1.0), 1.0)
    if valid is not None:
        gap = max(padded_gaps)
        rows.append(
            Verdict(
                f"trainer's log-mass on {_vocab(rollout) - valid} ids past the tokenizer",
                gap,
                limit,
                gap <= tolerance,
            )
        )

    eos = rollout.eos_id()
    misaligned = sum(
        not (len(t) == len(lp) == len(h))
        for out in outputs
        for t, lp, h in zip(out.tokens, out.logprobs or [], out.entropy or [], strict=True)
    )
    early_stops = sum(
        bool(np.isin(np.asarray(t)[:-1], [eos, pad]).any()) for out in outputs for t in out.tokens
    )
    if lora:
        nnx.update(trainer, small_adapters(nnx.state(trainer, nnx.LoRAParam), config.seed + 2))
        rollout.update_params(nnx.state(trainer, nnx.LoRAParam), (nnx.LoRAParam,))
        error = lora_update_error(rollout, trainer)
        lora_limit = 1e-2 if tolerance == BF16_TOLERANCE else 1e-5
        rows.append(
            Verdict(
                f"LoRA update served, small B (rel. error, {engine_dtype(rollout)})",
                error,
                f"<= {lora_limit:g}",
                error <= lora_limit,
            )
        )
    rows += [
        Verdict(
            "completions with len(logprobs|entropy) != tokens", misaligned, "== 0", not misaligned
        ),
        Verdict("completions with EOS / pad before the end", early_stops, "== 0", not early_stops),
        Verdict("pad id == EOS id (trainer would mask EOS)", float(pad == eos), "== 0", pad != eos),
        pad_row,
    ]
    return rows


def fidelity_limit(tolerance: float, floor: float, temperature: float) -> float:
    """The largest engine-vs-trainer logprob gap allowed at `temperature`: `tolerance`; for
    a bfloat16 engine at least twice the trainer's own layout spread `floor` (measured at
    T=1) over `temperature`, as a logit gap grows as 1 / T."""
    if tolerance != BF16_TOLERANCE:
        return tolerance
    return max(tolerance, 2.0 * floor / temperature)


def _gaps(logprobs, reference: np.ndarray, ends: list[int]) -> np.ndarray:
    """|a - b| of every compared token: `logprobs` (per row) against `reference` `[B, L]`,
    each row up to its end."""
    parts = [
        np.abs(np.asarray(lp)[:k] - reference[i, :k])
        for i, (lp, k) in enumerate(zip(logprobs, ends, strict=True))
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


def _floor(
    rollout, trainer, out, mean_gap: float, replay: bool, say
) -> tuple[list[Verdict], float]:
    """The trainer against itself on the T=1 rows, as given and with `LAYOUT_PAD_COLUMNS`
    more pad columns (same tokens, same positions): the spread no implementation beats
    without batch-invariant kernels on both sides, reported beside the engine's mean gap;
    and its max."""
    from tunix_adapter.scoring import (
        LAYOUT_PAD_COLUMNS,
        before_pad,
        trainer_logps,
        with_more_padding,
    )

    say(f"the trainer against itself, {LAYOUT_PAD_COLUMNS} more pad columns (the floor)")
    pad = rollout.pad_id()
    given = trainer_logps(rollout, trainer, out, 1.0, replay)
    wider = trainer_logps(rollout, trainer, with_more_padding(out, pad), 1.0, replay)
    spread = _gaps(list(given), wider, [before_pad(t, pad) for t in out.tokens])
    top = float(spread.max(initial=0.0))
    return [
        Verdict("logprob mean |diff| vs trainer, T=1.0", mean_gap, "reported", True),
        Verdict("floor: trainer vs itself, other padding, max", top, "reported", True),
        Verdict(
            "floor: trainer vs itself, other padding, mean",
            float(spread.mean()) if spread.size else 0.0,
            "reported",
            True,
        ),
    ], top


def valid_ids(rollout) -> int | None:
    """The tokenizer's length where the model's vocabulary is longer (the engine never samples
    the ids past it: `SamplerConfig.valid_vocab_size`), else None."""
    length = len(rollout.engine.tokenizer)
    return length if length < _vocab(rollout) else None


def padded_log_mass(logits: np.ndarray, valid: int) -> np.ndarray:
    """`-log(1 - m)` per position `[B, L]`, `m` the probability the trainer's (temperature-
    scaled) logits `[B, L, V]` put on ids `>= valid`: what the trainer's logprob of any id below
    `valid` lacks against the engine's, which renormalises over those ids."""
    z = logits.astype(np.float64)
    return check_exact.logsumexp(z) - check_exact.logsumexp(z[..., :valid])


def _vocab(rollout) -> int:
    return int(rollout.engine.vocab_size)


def pad_in_prompts(prompt_ids: list[list[int]], pad: int, token: str | None) -> Verdict:
    """The row for the pad id inside the tested prompts: how many hold it (tunix would read
    those tokens as padding), named by id."""
    holding = sum(pad in ids for ids in prompt_ids)
    return Verdict(f"prompts holding the pad id {pad} ({token})", holding, "== 0", not holding)


def engine_dtype(rollout) -> str:
    """The dtype the engine's weights are served in."""
    from tunix_adapter.scoring import floating_dtype

    return str(floating_dtype(rollout.engine.engine_state()))


def trainer_dtype(trainer) -> str:
    """The dtype the trainer computes in: its config's `dtype` where it has one (tunix's Qwen
    models), else its weights'."""
    from flax import nnx

    from tunix_adapter.scoring import floating_dtype

    config = getattr(trainer, "config", None)
    named = getattr(config, "dtype", None)
    return str(np.dtype(named) if named is not None else floating_dtype(nnx.state(trainer)))
