"""What one sampler call takes and returns, and how a batch is built from options.

Owns three types:
- `SamplerConfig`: the static modes (hashable; one compile per config, batch bucket and vocab).
- `SamplingBatch`: per-row settings as arrays, so changing them never recompiles.
- `SamplerOutput`: next tokens and, per config, their logprob, entropy and top logprobs.
and `build_batch`, the one builder of a `SamplingBatch` from per-row `SamplingOptions` (host
arrays; the engine's rows and `make_batch`, its device form for direct use, both call it).
Keys: a batch carries each row's base key, and the sampler folds in the row's generated count.

Must not import tunix or sgl_jax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt32

from sgl_jax_rollout.sampling.options import ENTROPY_SOURCES, LOGPROBS_MODES, SamplingOptions

# Padding value of the token-id arrays (prompt, output, stop ids): ignored by the sampler.
NO_TOKEN = -1
DEFAULT_CANDIDATES = 64
# The sampler's PRNG, whatever `jax_default_prng_impl` says (rbg / unsafe_rbg keys have other
# shapes and streams): a row draws one uniform per step, so the implementation costs nothing
# measurable, and a seed gives the same tokens on every platform and setting.
KEY_IMPL = "threefry2x32"
# Narrowest token-id tables (power-of-two widths above these).
MIN_TOKEN_WIDTH = 64
MIN_STOP_WIDTH = 8


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Static modes of the sampler: changing one compiles a new step.

    penalties: apply repetition / frequency / presence penalties and min_new_tokens (needs the
        token-id arrays of the batch). Off, those settings must be neutral.
    return_logprob / logprobs_mode: the sampled token's logprob, "processed" or "raw".
    return_entropy / entropy_source / entropy_top_k: per-token entropy (docs/design.md section 3).
    top_logprobs: how many top tokens to return with logprobs (0 = none).
    candidates: size of the bounded candidate set taken with `lax.top_k`; rows whose kept set
        fits in it never touch the full vocabulary again. Larger rows fall back to an exact
        threshold search.
    valid_vocab_size: ids at or beyond it (padding of the model's vocabulary) are masked.
    """

    penalties: bool = True
    return_logprob: bool = True
    logprobs_mode: str = "processed"
    return_entropy: bool = True
    entropy_source: str = "raw"
    entropy_top_k: int = 0
    top_logprobs: int = 0
    candidates: int = DEFAULT_CANDIDATES
    valid_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {list(LOGPROBS_MODES)}, got {self.logprobs_mode!r}"
            )
        if self.entropy_source not in ENTROPY_SOURCES:
            raise ValueError(
                f"entropy_source must be one of {list(ENTROPY_SOURCES)}, "
                f"got {self.entropy_source!r}"
            )
        if self.entropy_top_k < 0:
            raise ValueError(f"entropy_top_k must be >= 0, got {self.entropy_top_k}")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {self.candidates}")

    def candidate_count(self, vocab_size: int) -> int:
        """Entries taken by `lax.top_k`: the candidates plus one sentinel to prove exactness."""
        wanted = max(self.candidates, self.entropy_top_k, self.top_logprobs) + 1
        return min(wanted, vocab_size)

    def check_vocab(self, vocab_size: int) -> None:
        if self.entropy_top_k > vocab_size:
            raise ValueError(
                f"entropy_top_k must be in [0, {vocab_size}] (the vocabulary size), "
                f"got {self.entropy_top_k}"
            )
        if self.valid_vocab_size is not None and not 0 < self.valid_vocab_size <= vocab_size:
            raise ValueError(
                f"valid_vocab_size must be in [1, {vocab_size}], got {self.valid_vocab_size}"
            )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingBatch:
    """Per-row settings of one sampler call; every field has the batch as first axis.

    top_k <= 0 disables top-k; temperature 0 marks a greedy row. `keys` are raw `KEY_IMPL` key
    data, each row's base key: its draw uses `step_keys(keys, num_generated)`. Token-id arrays
    are padded with `NO_TOKEN`; they may be None when the config has `penalties=False`. `seen` /
    `output_counts` (`penalties.occurrence_tables`) replace `prompt_ids` / `output_ids` for
    penalties when set.
    """

    temperature: Float[Array, " batch"]
    top_k: Int[Array, " batch"]
    top_p: Float[Array, " batch"]
    min_p: Float[Array, " batch"]
    repetition_penalty: Float[Array, " batch"]
    frequency_penalty: Float[Array, " batch"]
    presence_penalty: Float[Array, " batch"]
    min_new_tokens: Int[Array, " batch"]
    num_generated: Int[Array, " batch"]
    keys: UInt32[Array, "batch 2"]
    prompt_ids: Int[Array, "batch prompt_len"] | None = None
    output_ids: Int[Array, "batch output_len"] | None = None
    stop_token_ids: Int[Array, "batch num_stop"] | None = None
    seen: Bool[Array, "batch vocab"] | None = None
    output_counts: Int[Array, "batch vocab"] | None = None

    @property
    def size(self) -> int:
        return self.temperature.shape[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """Result of one step; fields the config did not ask for are None."""

    tokens: Int[Array, " batch"]
    logprobs: Float[Array, " batch"] | None = None
    entropy: Float[Array, " batch"] | None = None
    top_logprob_ids: Int[Array, "batch n"] | None = None
    top_logprobs: Float[Array, "batch n"] | None = None


def _key(data: UInt32[Array, " 2"]) -> jax.Array:
    """A typed key of `KEY_IMPL` from its raw data (never the process's default impl)."""
    return jax.random.wrap_key_data(data, impl=KEY_IMPL)


def row_key(seed: int, step: int) -> np.ndarray:
    """Key data of a seeded row at one decode step (host-side, batch-independent)."""
    key = jax.random.fold_in(_key(jnp.asarray(base_keys([seed])[0])), step)
    return np.asarray(jax.random.key_data(key), dtype=np.uint32)


def base_keys(seeds: Sequence[int]) -> np.ndarray:
    """Key data `[seed >> 32, seed & 0xffffffff]` of each seed (what threefry's own seeding
    gives a 64-bit seed): all 63 bits of a seed reach the key. Built with numpy, no device
    call per row."""
    values = np.asarray([int(s) for s in seeds], np.uint64).reshape(-1)
    out = np.zeros((len(values), 2), np.uint32)
    out[:, 0] = (values >> np.uint64(32)).astype(np.uint32)
    out[:, 1] = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return out


def step_keys(keys: UInt32[Array, "batch 2"], steps: Int[Array, " batch"]) -> jax.Array:
    """Folds each row's step into its base key: `step_keys(base_keys([s]), [t]) == row_key(s, t)`.

    Runs inside jit, so an engine passes seeds once per request and never computes keys on the
    host per step.
    """

    def fold(data, step):
        return jax.random.key_data(jax.random.fold_in(_key(data), step))

    return jax.vmap(fold)(keys, steps.astype(jnp.uint32))


def config_for(options: Sequence[SamplingOptions], **static: object) -> SamplerConfig:
    """The static config that serves every row of `options` (their modes must agree)."""
    fields = {
        "logprobs_mode": {o.logprobs_mode for o in options},
        "entropy_source": {o.entropy_source for o in options},
        "entropy_top_k": {o.entropy_top_k for o in options},
    }
    for name, values in fields.items():
        if len(values) > 1:
            raise ValueError(f"rows of one batch must share {name}, got {sorted(values)}")
    return SamplerConfig(
        return_logprob=any(o.return_logprobs for o in options),
        return_entropy=any(o.return_entropy for o in options),
        top_logprobs=max(o.top_logprobs for o in options),
        **{name: values.pop() for name, values in fields.items()},
        **static,
    )


def build_batch(
    options: Sequence[SamplingOptions | None],
    *,
    stop_ids: Sequence[Sequence[int]] | None = None,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    output_ids: Sequence[Sequence[int]] | None = None,
    keys: np.ndarray | None = None,
    padded_rows: int | None = None,
    tables: bool = True,
) -> SamplingBatch:
    """The one builder of a `SamplingBatch`, as host (numpy) arrays.

    Row i serves `options[i]`; None rows and rows past `options` up to `padded_rows` are
    greedy padding. `num_generated` is the length of each row's output ids. `keys` are each
    row's base key (`base_keys`: a seeded row's from its seed; a row without a seed needs
    `keys[i]`); the sampler folds `num_generated` into it, so a seeded row draws the same
    tokens in any batch. With `tables`, prompt, output and stop ids are padded with `NO_TOKEN`
    to power-of-two widths (at least `MIN_TOKEN_WIDTH` / `MIN_STOP_WIDTH`): a batch with
    penalties compiles once per width bucket, never per prompt length.
    """
    rows = len(options)
    size = rows if padded_rows is None else padded_rows
    if rows > size:
        raise ValueError(f"{rows} rows do not fit in a batch padded to {size}")
    pad = size - rows
    stops = stop_ids or [()] * rows
    prompts = prompt_ids or [()] * rows
    outputs = output_ids or [()] * rows
    given = None if keys is None else np.asarray(keys, np.uint32)
    if given is not None and given.shape != (rows, 2):
        raise ValueError(f"keys must have shape ({rows}, 2), got {given.shape}")
    unseeded = [i for i, o in enumerate(options) if o is not None and o.seed is None]
    if unseeded and given is None:
        raise ValueError(f"row {unseeded[0]} has no seed and no key was given")
    seeds = [0 if o is None or o.seed is None else o.seed for o in options]
    key_data = base_keys(seeds + [0] * pad)
    if unseeded:
        key_data[unseeded] = given[unseeded]

    def column(field, dtype, fill):
        values = [fill if o is None else getattr(o, field) for o in options]
        return np.asarray(values + [fill] * pad, dtype)

    batch = SamplingBatch(
        temperature=column("temperature", np.float32, 0.0),
        top_k=column("top_k", np.int32, -1),
        top_p=column("top_p", np.float32, 1.0),
        min_p=column("min_p", np.float32, 0.0),
        repetition_penalty=column("repetition_penalty", np.float32, 1.0),
        frequency_penalty=column("frequency_penalty", np.float32, 0.0),
        presence_penalty=column("presence_penalty", np.float32, 0.0),
        min_new_tokens=column("min_new_tokens", np.int32, 0),
        num_generated=np.asarray([len(x) for x in outputs] + [0] * pad, np.int32),
        keys=key_data,
    )
    if not tables:
        return batch
    return dataclasses.replace(
        batch,
        prompt_ids=_bucketed(prompts, size, MIN_TOKEN_WIDTH),
        output_ids=_bucketed(outputs, size, MIN_TOKEN_WIDTH),
        stop_token_ids=_bucketed(stops, size, MIN_STOP_WIDTH),
    )


def make_batch(
    options: Sequence[SamplingOptions],
    *,
    vocab_size: int,
    keys: np.ndarray | None = None,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    output_ids: Sequence[Sequence[int]] | None = None,
    eos_token_ids: Sequence[int] = (),
) -> SamplingBatch:
    """A device batch from per-row options (validated against `vocab_size`): `build_batch`
    with each row's stop ids for min_new_tokens, its `stop_token_ids` plus `eos_token_ids`
    unless ignore_eos. Rows without a seed need `keys` (base keys, as `build_batch`)."""
    if not options:
        raise ValueError("options must hold at least one row")
    for o in options:
        o.validate_for_vocab(vocab_size)
    stops = [
        list(o.stop_token_ids) + ([] if o.ignore_eos else list(eos_token_ids)) for o in options
    ]
    host = build_batch(
        options, stop_ids=stops, prompt_ids=prompt_ids, output_ids=output_ids, keys=keys
    )
    return jax.tree.map(jnp.asarray, host)


def bucket(length: int, minimum: int) -> int:
    """Smallest power of two >= length and >= minimum."""
    width = minimum
    while width < length:
        width *= 2
    return width


def _bucketed(rows: Sequence[Sequence[int]], num_rows: int, minimum: int) -> np.ndarray:
    width = bucket(max([0, *(len(r) for r in rows)]), minimum)
    return token_id_table(rows, width, num_rows)


def token_id_table(
    rows: Sequence[Sequence[int]], width: int, num_rows: int | None = None
) -> np.ndarray:
    """Host table `[num_rows, width]` of `rows`, right-padded (and extra rows filled) with
    `NO_TOKEN`; `num_rows` defaults to `len(rows)`."""
    out = np.full((len(rows) if num_rows is None else num_rows, width), NO_TOKEN, np.int32)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} token ids, more than the padded {width}")
        out[i, : len(r)] = r
    return out
