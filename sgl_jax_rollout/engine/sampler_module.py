"""Our sampler as sgl-jax's model runner sees it, and the pytrees that carry its data.

Owns:
- `RolloutSamplingMetadata`: sgl-jax's `SamplingMetadata` plus two children, our rows for the
  step (`rows.PackedRows`, unpacked to a `SamplingBatch` inside the jitted step) and the
  device state of the request slots (`slot_state.SlotState`, attached on the thread that runs
  the step), and in the aux data our static `SamplerConfig` and whether the sampler runs
  vocabulary-parallel (one compile per config and batch bucket; per-row settings never
  recompile).
- `RolloutLogitsOutput`: sgl-jax's `LogitsProcessorOutput` (12 fixed pytree children) plus
  our per-token entropy and top logprobs and the advanced slot state. Extra attributes on the
  stock class would be dropped at the jit boundary, hence a registered subclass. After the
  step it may also carry the logprobs per padded row (`rollout_logprobs`, host side).
- `RolloutSampler`: the module the runner builds in place of `Sampler` (`sampler_class`).

Only imported once sgl_jax is importable (its classes come from `upstream.py`). The sampling
math lives in `sgl_jax_rollout.sampling`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.tree_util import register_pytree_node_class

from sgl_jax_rollout.engine import slot_state, upstream
from sgl_jax_rollout.engine.rows import PackedRows, slot_columns, unpack_rows
from sgl_jax_rollout.engine.slot_state import SlotState
from sgl_jax_rollout.sampling.batch import SamplerConfig, SamplerOutput
from sgl_jax_rollout.sampling.sampler import sample
from sgl_jax_rollout.sampling.vocab_parallel import sample_vocab_parallel

LogitsProcessorOutput = upstream.get("LogitsProcessorOutput")
SamplingMetadata = upstream.get("SamplingMetadata")
STOCK_METADATA_CHILDREN = upstream.STOCK_METADATA_CHILDREN
STOCK_OUTPUT_CHILDREN = upstream.STOCK_OUTPUT_CHILDREN


@register_pytree_node_class
@dataclasses.dataclass
class RolloutSamplingMetadata(SamplingMetadata):
    rollout_rows: PackedRows | None = None
    rollout_state: SlotState | None = None
    rollout_config: SamplerConfig | None = None
    rollout_vocab_parallel: bool = False
    # Our static fields, carried in the aux data (part of the compile key).
    STATIC_FIELDS: ClassVar[tuple[str, ...]] = ("rollout_config", "rollout_vocab_parallel")

    def tree_flatten(self):
        children, aux = super().tree_flatten()
        extra = (self.rollout_rows, self.rollout_state)
        ours = {name: getattr(self, name) for name in self.STATIC_FIELDS}
        return (*children, *extra), {**aux, **ours}

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        stock = {k: v for k, v in aux_data.items() if k not in cls.STATIC_FIELDS}
        obj = super().tree_unflatten(stock, children[:STOCK_METADATA_CHILDREN])
        obj.rollout_rows, obj.rollout_state = children[STOCK_METADATA_CHILDREN:]
        for name in cls.STATIC_FIELDS:
            setattr(obj, name, aux_data[name])
        return obj


@register_pytree_node_class
@dataclasses.dataclass
class RolloutLogitsOutput(LogitsProcessorOutput):
    rollout_entropy: jax.Array | None = None
    rollout_top_logprob_ids: jax.Array | None = None
    rollout_top_logprobs: jax.Array | None = None
    rollout_state: SlotState | None = None
    # Host side only, never a pytree child: the step's logprobs per padded row, moved here
    # from `next_token_logprobs` when upstream reads none (the outputs_in_flight patch).
    rollout_logprobs: jax.Array | None = None

    def tree_flatten(self):
        children, aux = super().tree_flatten()
        extra = (
            self.rollout_entropy,
            self.rollout_top_logprob_ids,
            self.rollout_top_logprobs,
            self.rollout_state,
        )
        return (*children, *extra), aux

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        obj = super().tree_unflatten(aux_data, children[:STOCK_OUTPUT_CHILDREN])
        (
            obj.rollout_entropy,
            obj.rollout_top_logprob_ids,
            obj.rollout_top_logprobs,
            obj.rollout_state,
        ) = children[STOCK_OUTPUT_CHILDREN:]
        return obj


class RolloutSampler(nnx.Module):
    """Drop-in for `sgl_jax.srt.layers.sampler.Sampler` (same constructor and call).

    Returns what the runner unpacks: next ids `[B_pad]` sharded `P("data")`, the logits (the
    runner gathers from them only for sgl-jax's own output-logprob mode, which our requests
    never use) and a `RolloutLogitsOutput`, which carries the advanced slot state back to the
    runner (the sample_with_slot_state patch keeps it for the next step). Randomness comes from
    each row's seed and step, not from `rngs` or `rng_override`: the module is rebuilt inside
    jit and its state is never returned, and a seeded request must draw the same tokens in any
    batch.
    """

    def __init__(self, rngs: nnx.Rngs | None = None, mesh: jax.sharding.Mesh | None = None):
        del rngs
        self.mesh = mesh

    def __call__(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_metadata: SamplingMetadata,
        use_sort_for_toppk_minp: bool = False,
        rng_override: jax.Array | None = None,
    ):
        del use_sort_for_toppk_minp, rng_override
        if not isinstance(sampling_metadata, RolloutSamplingMetadata):
            raise TypeError(
                "RolloutSampler needs RolloutSamplingMetadata: the from_model_worker_batch "
                "patch of sgl_jax_rollout.engine.patches is not installed"
            )
        vocab_parallel = sampling_metadata.rollout_vocab_parallel
        logits = logits_output.next_token_logits
        if not vocab_parallel:
            logits = jax.sharding.reshard(logits, NamedSharding(self.mesh, P("data", None)))
        if sampling_metadata.rollout_state is None:
            raise TypeError(
                "RolloutSampler needs the slot state: sample_with_slot_state attaches it"
            )
        out, state = self._sample(
            logits,
            sampling_metadata.rollout_rows,
            sampling_metadata.rollout_state,
            sampling_metadata.rollout_config,
            vocab_parallel,
        )
        replicated = NamedSharding(self.mesh, P(None))
        ids = jax.sharding.reshard(
            out.tokens.astype(jnp.int32), NamedSharding(self.mesh, P("data"))
        )
        children, aux = logits_output.tree_flatten()
        result = RolloutLogitsOutput.tree_unflatten(
            aux, (*children, out.entropy, out.top_logprob_ids, out.top_logprobs, state)
        )
        # Always set: sgl-jax rewrites plain return_logprob to a path that reads it.
        logprobs = out.logprobs if out.logprobs is not None else jnp.zeros(ids.shape, jnp.float32)
        result.next_token_logprobs = jax.sharding.reshard(logprobs, replicated)
        return ids, logits, result

    def _sample(
        self,
        logits,
        packed: PackedRows,
        state: SlotState,
        config: SamplerConfig,
        vocab_parallel: bool,
    ) -> tuple[SamplerOutput, SlotState]:
        """The rows take their slots' state, our sampler runs (on the vocabulary-split logits
        with `vocab_parallel`, else on logits gathered to `P("data", None)`), the slots
        advance; in auto-sharding mode (its gathers have no explicit out-sharding)."""
        rows = NamedSharding(self.mesh, P("data"))
        table = NamedSharding(self.mesh, P("data", None))
        shardings = SamplerOutput(
            tokens=rows,
            logprobs=rows if config.return_logprob else None,
            entropy=rows if config.return_entropy else None,
            top_logprob_ids=table if config.top_logprobs else None,
            top_logprobs=table if config.top_logprobs else None,
        )
        replicated = NamedSharding(self.mesh, P())
        state_shardings = jax.tree.map(lambda _: replicated, state)

        def step(logits, packed, state):
            slot, join = slot_columns(packed)
            batch = slot_state.joined(state, unpack_rows(packed), slot, join)
            if vocab_parallel:
                # The context mesh: the runner's, with Auto axes inside `auto_axes`.
                out = sample_vocab_parallel(logits, batch, config, batch_axis="data")
            else:
                out = sample(logits, batch, config=config)
            return out, slot_state.advanced(state, batch, slot, out.tokens)

        run = jax.sharding.auto_axes(step, out_sharding=(shardings, state_shardings))
        return run(logits, packed, state)
