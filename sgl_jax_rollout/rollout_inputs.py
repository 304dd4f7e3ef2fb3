"""Translation between tunix's rollout vocabulary and ours, and the padding the trainer expects.

Owns the host-side rules of `SglangJaxRollout`, kept apart so they are tested without an
engine: `RolloutConfig` + per-call overrides -> `SamplingOptions`; per-sample seeds (`n`
samples of a prompt are adjacent; an int seed gives every row its own stream, a list gives
one seed per prompt, a JAX PRNG key one stream); `eos_tokens` checked against the
vocabulary; prompt left truncation and left padding; completion lengths inside padded arrays
(docs/design.md section 4); a completion ended at a sampled pad id (`cut_at_pad`);
`generation_config.json` -> default options (only when the user opts in); the sampler modes
a rollout's calls will use (compiled at start).

Imports neither sgl_jax nor tunix (a `RolloutConfig` is read by attribute).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jaxtyping import Float, Int

from sgl_jax_rollout.sampling.options import SamplingOptions

logger = logging.getLogger(__name__)

MAX_SEED = 2**63 - 1


def options_for_call(
    defaults: SamplingOptions, rollout_config: Any, overrides: Mapping[str, Any]
) -> SamplingOptions:
    """Options of one `generate` call: defaults, then RolloutConfig fields, then overrides.

    RolloutConfig's `top_p=None` and `top_k=None` (or 0) mean disabled. `seed` is handled per
    sample (`sample_seeds`), so it is not taken here.
    """
    if "seed" in overrides:
        raise ValueError("pass seed through rollout_config.seed (int or one per prompt)")
    top_p = rollout_config.top_p
    top_k = rollout_config.top_k
    options = defaults.replace(
        temperature=rollout_config.temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=-1 if top_k in (None, 0) else top_k,
        return_logprobs=bool(getattr(rollout_config, "return_logprobs", True)),
        seed=None,
    )
    return options.replace(**dict(overrides))


def sample_seeds(
    seed: Any,
    num_prompts: int,
    n: int,
    fresh: np.random.Generator,
    share: tuple[int, int] = (0, 1),
) -> list[int]:
    """One seed per sample, prompt-major (`[p0s0, p0s1, ..., p1s0, ...]`).

    - None: fresh seeds drawn from `fresh` (the rollout's own generator).
    - int: row r (= prompt * n + sample) gets a seed derived from (seed, r), so repeated
      prompts (how GRPO builds groups) still get different samples.
    - one value per prompt: sample 0 of prompt i uses seed[i] itself, sample j > 0 a seed
      derived from (seed[i], j); the same per-prompt seed reproduces its samples.
    - a JAX PRNG key (a typed key, or uint32 key data such as `jax.random.PRNGKey(0)`, which
      is how tunix's own samplers read the field): one stream, like an int.

    `share` = (index, count): these rows are share `index` of `count` equal shares of a global
    batch (one per JAX process, `engine.hosts.process_share`). An int, a key or None then gives
    them the seeds of rows `index * rows ...` of the global batch: every row of every share
    its own stream, the same as one process sampling the whole batch. Per-prompt seeds are
    the caller's and are used as given.
    """
    rows = num_prompts * n
    index, count = share
    first = index * rows
    if seed is None:
        return [int(s) for s in fresh.integers(0, MAX_SEED, size=count * rows)[first:][:rows]]
    key_words = _prng_key_words(seed)
    if key_words is not None:  # a JAX PRNG key (RolloutConfig.seed's type): one stream
        base = _derive(*key_words)
        return [_derive(base, first + r) for r in range(rows)]
    values = np.asarray(seed)
    if values.ndim == 0:
        base = _as_seed(values.item(), "seed")
        return [_derive(base, first + r) for r in range(rows)]
    flat = [_as_seed(v, "seed") for v in values.reshape(-1).tolist()]
    if len(flat) != num_prompts:
        raise ValueError(
            f"seed must be an int or one value per prompt ({num_prompts}), got {len(flat)}"
        )
    return [s if j == 0 else _derive(s, j) for s in flat for j in range(n)]


def _prng_key_words(seed: Any) -> list[int] | None:
    """The words of a JAX PRNG key, as tunix reads `RolloutConfig.seed` (a typed key, or a
    uint32 `jax.Array` of raw key data such as `jax.random.PRNGKey(0)`); None otherwise."""
    if not isinstance(seed, jax.Array):
        return None
    if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        if seed.shape != ():
            raise ValueError(f"seed: a PRNG key must be a single key, got shape {seed.shape}")
        seed = jax.random.key_data(seed)
    elif seed.dtype != np.uint32 or seed.ndim != 1:
        return None
    return [int(w) for w in np.asarray(seed).reshape(-1)]


def eos_token_list(eos_tokens: Any, vocab_size: int) -> list[int]:
    """`RolloutConfig.eos_tokens` as ids in [0, vocab_size), or ValueError naming the entry."""
    if eos_tokens is None:
        return []
    if isinstance(eos_tokens, str | bytes) or not isinstance(eos_tokens, Sequence | np.ndarray):
        raise ValueError(f"eos_tokens must be a list of token ids, got {eos_tokens!r}")
    out = []
    for i, t in enumerate(np.asarray(eos_tokens, dtype=object).reshape(-1).tolist()):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"eos_tokens[{i}] must be a token id in [0, {vocab_size}), got {t!r}")
        out.append(t)
    return out


def _as_seed(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must hold integers >= 0, got {value!r}")
    return int(value) % (MAX_SEED + 1)


def _derive(*words: int) -> int:
    state = np.random.SeedSequence(list(words)).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) % (MAX_SEED + 1)


def bos_prefix(bos_id: int | None) -> list[int]:
    """The BOS to put before a prompt: none when the tokenizer has none (None, or -1 from
    SentencePiece). Id 0 is a real token (tunix's samplers test `if bos_id()` and drop it)."""
    return [] if bos_id is None or bos_id < 0 else [int(bos_id)]


def truncate_left(ids: Sequence[int], max_length: int) -> tuple[list[int], int]:
    """Keeps the last `max_length` ids; returns them and how many were dropped."""
    ids = list(ids)
    dropped = max(0, len(ids) - max_length)
    return ids[dropped:], dropped


def left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> Int[np.ndarray, "b w"]:
    out = np.full((len(rows), width), pad_id, np.int32)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} tokens, more than the padded width {width}")
        if len(r):
            out[i, width - len(r) :] = r
    return out


def prompt_rows(prompt_tokens: Int[np.ndarray, "b p"], pad_id: int) -> list[list[int]]:
    """Prompts of a left-padded array: the ids after the leading pad run."""
    rows = []
    for row in np.asarray(prompt_tokens):
        keep = np.flatnonzero(row != pad_id)
        rows.append(row[keep[0] :].tolist() if keep.size else [])
    return rows


def completion_rows(
    completion_tokens: Int[np.ndarray, "b c"], pad_id: int, eos_id: int
) -> list[list[int]]:
    """Completions of a right-padded array: through the first EOS, else up to the first pad."""
    rows = []
    for row in np.asarray(completion_tokens).tolist():
        end = len(row)
        if eos_id in row:
            end = row.index(eos_id) + 1
        elif pad_id in row:
            end = row.index(pad_id)
        rows.append(row[:end])
    return rows


def cut_at_pad(completion: Any, pad_id: int | None, keep: bool = True) -> Any:
    """`completion` (an engine `Completion`) ended at the first pad id it holds, as at a stop:
    tunix reads every pad as padding, so a token after one would be scored at a shifted
    position. What follows the pad (sampled with `ignore_eos`) leaves its tokens, values and
    routing rows; the pad stays as the last token, as a stop token does (`keep`), or goes too
    (a session turn: the next prompt must not hold it). `finish_reason` says it stopped
    there. Unchanged without a pad."""
    hits = np.flatnonzero(np.asarray(completion.tokens, np.int64) == pad_id)
    if pad_id is None or not hits.size:
        return completion
    k, n = int(hits[0]) + int(keep), len(completion.tokens)

    def cut(values: Any) -> Any:
        return None if values is None else values[:k]

    routed = completion.routed_experts  # one row per input position: prompt + tokens - 1
    return dataclasses.replace(
        completion,
        tokens=list(completion.tokens[:k]),
        logprobs=cut(completion.logprobs),
        entropy=cut(completion.entropy),
        top_logprob_ids=cut(completion.top_logprob_ids),
        top_logprobs=cut(completion.top_logprobs),
        routed_experts=None if routed is None else routed[: len(routed) - (n - k)],
        finish_reason={"type": "stop", "matched": int(pad_id)},
    )


def sample_limits(limits: Sequence[int] | None, samples: int, max_new: int) -> list[int] | None:
    """Each sample's own max new tokens (`generate_groups`' `max_tokens_per_sample`), checked:
    one integer in [1, `max_new`] per sample; None stays None (every sample has the call's)."""
    if limits is None:
        return None
    limits = list(limits)
    if len(limits) != samples:
        raise ValueError(
            f"max_tokens_per_sample has {len(limits)} entries for {samples} samples "
            "(prompts x n, a group's samples adjacent)"
        )
    for i, value in enumerate(limits):
        integer = isinstance(value, int | np.integer) and not isinstance(value, bool)
        if not (integer and 1 <= value <= max_new):
            raise ValueError(
                f"max_tokens_per_sample[{i}] must be an integer in [1, {max_new}] "
                f"(max_tokens_to_generate), got {value!r}"
            )
    return [int(v) for v in limits]


def prompt_list(prompts: Any) -> list[str]:
    """`generate`'s prompts as a list of strings (tunix's PPO learner passes a numpy array;
    its agentic learner, under 0.1.7, one `str`: one prompt, as tunix's `VanillaRollout`
    takes it); raises ValueError naming what is wrong."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, np.ndarray) and prompts.ndim == 1:
        prompts = prompts.tolist()
    if not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts must not be empty")
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    if bad:
        raise ValueError(f"prompts must be strings; not at index(es) {bad[:10]}")
    return list(prompts)


def scoring_rows(
    prompt_tokens: Int[Any, "b p"], completion_tokens: Int[Any, "b c"], pad_id: int, eos_id: int
) -> tuple[list[list[int]], list[list[int]], int]:
    """`get_per_token_logps`'s padded arrays as (prompt rows, completion rows, completion
    width); raises ValueError on shapes that do not pair up."""
    prompt_tokens = np.asarray(prompt_tokens)
    completion_tokens = np.asarray(completion_tokens)
    if prompt_tokens.ndim != 2 or completion_tokens.ndim != 2:
        raise ValueError("prompt_tokens and completion_tokens must be 2-D [batch, length]")
    if prompt_tokens.shape[0] != completion_tokens.shape[0]:
        raise ValueError(
            f"batch sizes differ: {prompt_tokens.shape[0]} prompts, "
            f"{completion_tokens.shape[0]} completions"
        )
    return (
        prompt_rows(prompt_tokens, pad_id),
        completion_rows(completion_tokens, pad_id, eos_id),
        completion_tokens.shape[1],
    )


def right_pad_ids(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> Int[np.ndarray, "b w"]:
    """Token id rows right-padded with `pad_id` (rows longer than `width` are cut)."""
    out = np.full((len(rows), width), pad_id, np.int32)
    for i, r in enumerate(rows):
        out[i, : min(len(r), width)] = np.asarray(r, np.int32)[:width]
    return out


def right_pad_values(rows: Sequence[np.ndarray], width: int) -> Float[np.ndarray, "b w"]:
    out = np.zeros((len(rows), width), np.float32)
    for i, r in enumerate(rows):
        out[i, : min(len(r), width)] = np.asarray(r, np.float32)[:width]
    return out


GENERATION_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}


def default_options(model_path: str | Path) -> SamplingOptions:
    """`SamplingOptions` from the model's generation_config.json (defaults where absent).

    `do_sample: false` means greedy (temperature 0); `top_k: 0` means disabled.
    """
    path = Path(model_path) / "generation_config.json"
    if not path.is_file():
        return SamplingOptions()
    config = json.loads(path.read_text())
    values = {ours: config[hf] for hf, ours in GENERATION_FIELDS.items() if hf in config}
    if values.get("top_k") == 0:
        values["top_k"] = -1
    if config.get("do_sample") is False:
        values["temperature"] = 0.0
    try:
        return SamplingOptions(**values)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def sampler_modes(defaults: SamplingOptions) -> list[dict[str, Any]]:
    """The sampler modes of calls with these defaults: their output modes with and without
    logprobs (`RolloutConfig.return_logprobs` chooses per call), penalties as the defaults
    have them (the rollout always holds back EOS, so `min_new_tokens` is a penalty)."""
    from sgl_jax_rollout.engine.rows import MODE_FIELDS

    penalties = (
        defaults.repetition_penalty != 1.0
        or defaults.frequency_penalty != 0.0
        or defaults.presence_penalty != 0.0
        or defaults.min_new_tokens > 0
    )
    mode = {field: getattr(defaults, field) for field in MODE_FIELDS}
    return [{**mode, "return_logprobs": ret, "penalties": penalties} for ret in (True, False)]


def rollout_defaults(
    model_path: str | Path,
    use_generation_config: bool,
    sampling: SamplingOptions | Mapping[str, Any] | None = None,
) -> SamplingOptions:
    """The rollout's default options: the library's, or with `use_generation_config` the
    model's generation_config.json (`default_options`); then the rollout's `sampling` (a
    `SamplingOptions` replaces them, a dict updates its fields).

    Opt-in because the file's values change the sampled distribution (Qwen2.5-Instruct ships
    `repetition_penalty` 1.05-1.1): applied silently, every rollout would be off-policy for a
    trainer that scores the plain model. Without opt-in, the values that would have applied
    are logged once, with the way to opt in.
    """
    if isinstance(sampling, SamplingOptions):
        return sampling
    base = _base_defaults(model_path, use_generation_config)
    return base if sampling is None else base.replace(**dict(sampling))


def _base_defaults(model_path: str | Path, use_generation_config: bool) -> SamplingOptions:
    from_file = default_options(model_path)
    if use_generation_config:
        return from_file
    library = SamplingOptions()
    skipped = {
        field: getattr(from_file, field)
        for field in GENERATION_FIELDS.values()
        if getattr(from_file, field) != getattr(library, field)
    }
    if skipped:
        logger.info(
            "%s/generation_config.json sets %s; not applied (rollouts use RolloutConfig's "
            "temperature / top_p / top_k and the library's other defaults). Pass "
            "use_generation_config=True to apply the file's values.",
            model_path,
            ", ".join(f"{k}={v}" for k, v in skipped.items()),
        )
    return library


def eos_ids(model_path: str | Path, tokenizer_eos: int | None) -> list[int]:
    """EOS ids of the model: generation_config.json's `eos_token_id` (int or list), else the
    tokenizer's."""
    path = Path(model_path) / "generation_config.json"
    ids: list[int] = []
    if path.is_file():
        value = json.loads(path.read_text()).get("eos_token_id")
        ids = [value] if isinstance(value, int) else list(value or [])
    if not ids and tokenizer_eos is not None:
        ids = [tokenizer_eos]
    return ids
