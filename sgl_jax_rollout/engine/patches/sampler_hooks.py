"""Sampler hooks: our jitted sampler in upstream's step, with per-row settings in and
per-token values out (catalog: `patches/__init__.py`).

Owns `install` for `sampler_class`, `worker_batch_rows`, `sampling_metadata_rows`,
`sample_with_slot_state`, `precompile_sampler_modes`, `precompile_overlap_gather`,
`step_values`, `outputs_in_flight` and `record_before_stream`.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.engine.collector import StepValues
from sgl_jax_rollout.engine.patches.hooks import (
    EngineHooks,
    batch_requests,
    current,
    fail_requests,
    requests_by_row,
    wrap,
    wrap_classmethod,
)
from sgl_jax_rollout.engine.rows import (
    RequestSpec,
    build_rows,
    pack_rows,
    sampler_config,
    slot_table,
)
from sgl_jax_rollout.engine.slot_state import new_slot_state
from sgl_jax_rollout.sampling.batch import SamplerConfig
from sgl_jax_rollout.sampling.options import SamplingOptions


def install() -> None:
    from sgl_jax_rollout.engine.sampler_module import RolloutSampler

    get = upstream.get
    upstream.module("model_executor.model_runner").Sampler = RolloutSampler
    wrap(get("ScheduleBatch"), "get_model_worker_batch", _worker_batch_rows)
    wrap_classmethod(get("SamplingMetadata"), "from_model_worker_batch", _sampling_metadata_rows)
    wrap(get("Scheduler"), "process_batch_result", _step_values)
    wrap(get("Scheduler"), "stream_output", _record_before_stream)
    wrap(get("ModelWorker"), "run_precompile", _precompiling)
    wrap(get("ModelWorker"), "_materialize_logprobs_to_host", _outputs_in_flight)
    wrap(get("ModelRunner"), "sample", _sample_with_slot_state)
    wrap(get("ModelWorkerClient"), "resolve_last_batch_result", _overlapped_step_values)


def _worker_batch_rows(original, self, *args, **kwargs):
    """worker_batch_rows: attach (config, host rows) for this batch's requests."""
    mwb = original(self, *args, **kwargs)
    hooks = current()
    if hooks is None:
        return mwb
    padded = len(mwb.sampling_info.temperatures)
    if hooks.neutral_rows:  # a failed step run again: greedy rows, the precompiled config
        mwb.rollout_rows = _neutral_rows(hooks.valid_vocab_size, padded)
        return mwb
    reqs = requests_by_row(self)
    # Extend rows join their slot: a new request, a chunk of one, or a retracted one coming
    # back (whose output ids are complete by then). Decode rows read their slot's state, so
    # a decode step with the same requests in the same slots has the same rows as the last.
    joining = self.forward_mode.is_extend()
    key = (padded, tuple(None if r is None else (r.rid, r.req_pool_idx) for r in reqs))
    cached = hooks.decode_rows
    if not joining and cached is not None and cached[0] == key:
        mwb.rollout_rows = cached[1]
        return mwb
    registered, specs = [], []
    for req in reqs:
        spec = None if req is None else hooks.collector.spec_for(req.rid)
        if spec is not None:
            registered.append(spec)
        specs.append(spec or (None if req is None else _fallback_spec(req)))
    config = sampler_config(registered, hooks.valid_vocab_size)
    if joining:
        prompts = [[] if req is None else req.origin_input_ids for req in reqs]
        outputs = [[] if req is None else req.output_ids for req in reqs]
    else:
        prompts = outputs = [[]] * len(reqs)
    slots = slot_table([None if r is None else r.req_pool_idx for r in reqs], joining, padded)
    rids = [req.rid for req in reqs if req is not None]
    mwb.rollout_rows = (config, build_rows(specs, prompts, outputs, padded, config), slots, rids)
    hooks.decode_rows = None if joining else (key, mwb.rollout_rows)
    return mwb


def _neutral_rows(valid_vocab_size: int | None, size: int, config: SamplerConfig | None = None):
    """(config, rows, slots, request ids) of a batch of greedy padding rows: precompile, and a
    failed step run again."""
    config = config or sampler_config([], valid_vocab_size)
    return config, build_rows([], [], [], size, config), slot_table([], True, size), []


def _fallback_spec(req: Any) -> RequestSpec:
    """Settings for a request we did not submit (sgl-jax's own warm-up, direct engine users)."""
    top_k_all = upstream.get("TOP_K_ALL")
    p = req.sampling_params
    seed = p.sampling_seed
    if seed is None:
        seed = int.from_bytes(hashlib.sha256(str(req.rid).encode()).digest()[:8], "little") >> 1
    try:
        options = SamplingOptions(
            temperature=float(p.temperature),
            top_k=-1 if p.top_k >= top_k_all else int(p.top_k),
            top_p=float(p.top_p),
            min_p=float(p.min_p),
            seed=seed,
        )
    except ValueError:
        options = SamplingOptions(temperature=0.0, seed=seed)
    return RequestSpec(options=options)


def _sampling_metadata_rows(original, batch, pad_size=0, mesh=None, vocab_size=32000):
    """sampling_metadata_rows: stock metadata plus our rows, on the mesh. The rows of the last
    step again (a decode step of the same requests in the same slots) reuse its metadata, already
    on the mesh: of the stock children, which upstream rebuilds and transfers every step, our
    sampler reads none (only their shapes, which the same batch keeps)."""
    hooks = current()
    rows = getattr(batch, "rollout_rows", None)
    placed = hooks.placed_rows if hooks is not None else None
    if rows is not None and placed is not None and placed[0] is rows:
        return copy.copy(placed[1])
    stock = original(batch, pad_size, mesh, vocab_size)
    if rows is None:
        # Precompile and requests outside our engine: neutral greedy rows, default config.
        valid = hooks.valid_vocab_size if hooks is not None else None
        return _with_rows(stock, *_neutral_rows(valid, len(batch.sampling_info.temperatures)), mesh)
    metadata = _with_rows(stock, *rows, mesh)
    if hooks is not None:
        hooks.placed_rows = (rows, metadata)
    return metadata


def _with_rows(
    stock: Any, config: SamplerConfig, host_rows: Any, slots: Any, rids: list[str], mesh: Any
):
    """Stock `SamplingMetadata` children plus our rows placed on the mesh (one transfer of
    `PackedRows`), `config` as aux; the step's request ids as a plain attribute (for
    `sample_with_slot_state`, which sees the object before jit)."""
    from sgl_jax_rollout.engine.sampler_module import RolloutSamplingMetadata

    packed = pack_rows(host_rows, slots)
    device_rows = jax.device_put(packed, NamedSharding(mesh, P("data", None)))
    children, aux = stock.tree_flatten()
    aux = {k: v for k, v in aux.items() if k not in RolloutSamplingMetadata.STATIC_FIELDS}
    metadata = RolloutSamplingMetadata.tree_unflatten(
        {**aux, "rollout_config": config, "rollout_vocab_parallel": False},
        (*children[: upstream.STOCK_METADATA_CHILDREN], device_rows, None),
    )
    metadata.rollout_rids = rids
    return metadata


def _precompiling(original, self, *args, **kwargs):
    """precompile_sampler_modes, part 1: mark the precompile."""
    hooks = current()
    if hooks is None:
        return original(self, *args, **kwargs)
    hooks.precompiling = True
    try:
        return original(self, *args, **kwargs)
    finally:
        hooks.precompiling = False


def _sample_with_slot_state(original, self, logits_output, sampling_metadata):
    """sample_with_slot_state: the sampler step with the slot state in and out; a failing
    sampler fails its requests; while precompiling, every extra config is compiled too."""
    hooks = getattr(self, "_sgl_jax_rollout_hooks", None)
    if hooks is None:
        return original(self, logits_output, sampling_metadata)
    try:
        result = _sample_step(original, self, hooks, logits_output, sampling_metadata)
    except Exception as err:
        if hooks.precompiling:
            raise
        # A sampler that cannot run (typically a new config that fails to compile) fails its
        # requests (on the scheduler thread, `_collect`); the step runs with neutral rows.
        rids = frozenset(getattr(sampling_metadata, "rollout_rids", []))
        hooks.failed_samples.append((rids, err))
        size = sampling_metadata.rollout_rows.size
        neutral = _with_rows(
            sampling_metadata, *_neutral_rows(hooks.valid_vocab_size, size), self.mesh
        )
        return _sample_step(original, self, hooks, logits_output, neutral)
    if hooks.precompiling:
        size = sampling_metadata.rollout_rows.size
        for config in hooks.sampler_configs:
            rows = _neutral_rows(hooks.valid_vocab_size, size, config)
            extra = _with_rows(sampling_metadata, *rows, self.mesh)
            jax.block_until_ready(_sample_step(original, self, hooks, logits_output, extra))
        _precompile_overlap_gather(hooks, result[0])
    return result


def _precompile_overlap_gather(hooks: EngineHooks, ids: Any) -> None:
    """precompile_overlap_gather: the overlap worker's gather of a step's ids, compiled for
    this batch bucket while upstream precompiles (nothing without overlap)."""
    worker = getattr(hooks.scheduler, "tp_worker", None)
    if isinstance(worker, upstream.get("ModelWorkerClient")):
        jax.block_until_ready(worker.async_gather_fn(ids))


def _sample_step(original, runner, hooks: EngineHooks, logits_output, sampling_metadata):
    """One run of the sampler with the slot state (made at the first step, its tables at the
    first step with penalties); keeps the advanced state."""
    config = sampling_metadata.rollout_config
    state = hooks.slot_state
    if state is None or (config.penalties and not state.has_tables):
        vocab = logits_output.next_token_logits.shape[-1] if config.penalties else None
        sharding = NamedSharding(runner.mesh, P())
        fresh = new_slot_state(runner.req_to_token_pool.size, vocab, sharding)
        # Running requests keep their counts when the tables first appear; their zeroed
        # tables are only read by rows without penalties (a penalised row joins with its ids).
        state = fresh if state is None else fresh._replace(num_generated=state.num_generated)
    metadata = copy.copy(sampling_metadata)
    metadata.rollout_state = state if config.penalties else state.without_tables()
    metadata.rollout_vocab_parallel = hooks.vocab_parallel
    ids, logits, out = original(runner, logits_output, metadata)
    advanced = out.rollout_state
    out.rollout_state = None
    hooks.slot_state = (
        advanced if config.penalties else state._replace(num_generated=advanced.num_generated)
    )
    return ids, logits, out


def _step_values(original, self, batch, result, *args, **kwargs):
    """step_values: give the collector this step's per-row values, then process the result.
    With overlap the values arrive in `resolve_last_batch_result`, called inside."""
    from sgl_jax_rollout.engine.sampler_module import RolloutLogitsOutput

    hooks = current()
    if hooks is None:
        return original(self, batch, result, *args, **kwargs)
    if self.enable_overlap:
        hooks.processing = (self, batch)
    else:
        out = getattr(result, "logits_output", None)
        if isinstance(out, RolloutLogitsOutput):
            _collect(hooks, self, batch, out)
    try:
        return original(self, batch, result, *args, **kwargs)
    finally:
        hooks.processing = None
        hooks.collector.end_step()


def _overlapped_step_values(original, self, *args, **kwargs):
    """step_values, overlap half: the last step's outputs, just resolved, to the collector."""
    from sgl_jax_rollout.engine.sampler_module import RolloutLogitsOutput

    resolved = original(self, *args, **kwargs)
    hooks = current()
    if (
        hooks is not None
        and hooks.processing is not None
        and isinstance(resolved[0], RolloutLogitsOutput)
    ):
        _collect(hooks, *hooks.processing, resolved[0])
    return resolved


def _outputs_in_flight(original, self, logits_output, model_worker_batch, *args, **kwargs):
    """outputs_in_flight: our per-row outputs start their copies to the host; upstream
    materialises logprobs only for a batch that asks it for them."""
    from sgl_jax_rollout.engine.sampler_module import RolloutLogitsOutput

    if isinstance(logits_output, RolloutLogitsOutput):
        batch = model_worker_batch
        if not (batch.return_logprob or batch.return_output_logprob_only):
            logits_output.rollout_logprobs = logits_output.next_token_logprobs
            logits_output.next_token_logprobs = None
        jax.copy_to_host_async(
            (
                logits_output.rollout_logprobs,
                logits_output.rollout_entropy,
                logits_output.rollout_top_logprob_ids,
                logits_output.rollout_top_logprobs,
            )
        )
    return original(self, logits_output, model_worker_batch, *args, **kwargs)


def _collect(hooks: EngineHooks, scheduler: Any, batch: Any, out: Any) -> None:
    """Fails the requests of this step if its sampler failed, then stashes its values.

    A failure here fails the batch's requests (`fail_requests`); the step is still processed,
    so upstream finishes them and frees their cache."""
    rows = requests_by_row(batch)
    filled = [i for i, req in enumerate(rows) if req is not None]
    _fail_if_its_sampler_failed(hooks, scheduler, [rows[i] for i in filled])
    try:
        # Our outputs have every padded row (their copies started in `outputs_in_flight`):
        # gather the requests' rows. Where upstream materialised the logprobs it has
        # gathered them to the same rows already (its `logits_indices_selector`: the requests
        # in row order, padding dropped).
        per_row = (
            out.rollout_logprobs,
            out.rollout_entropy,
            out.rollout_top_logprob_ids,
            out.rollout_top_logprobs,
        )
        own_logprobs, entropy, top_ids, top_values = (
            None if x is None else np.asarray(x)[filled] for x in per_row
        )
        logprobs = out.next_token_logprobs if own_logprobs is None else own_logprobs
        values = StepValues(  # per-row floats as lists: the collector reads one per request
            logprobs=None if logprobs is None else np.asarray(logprobs).tolist(),
            entropy=None if entropy is None else entropy.tolist(),
            top_logprob_ids=top_ids,
            top_logprobs=top_values,
        )
        hooks.collector.stash_step([rows[i] for i in filled], values)
    except Exception as err:
        fail_requests(scheduler, batch_requests(batch), hooks, "collecting sampler values", err)


def _fail_if_its_sampler_failed(hooks: EngineHooks, scheduler: Any, reqs: list[Any]) -> None:
    """Fails `reqs`, one step's requests, if that step's sampler call failed. A failure is
    matched to its step by the step's request ids: with overlap the sampler of step t runs
    while the scheduler processes step t - 1, so the next step processed is not the one that
    failed (the batch processed is the one launched, copied: `Scheduler.event_loop_overlap`,
    `result_queue.append((batch.copy(), result))`). A failure of a step without requests
    fails nothing."""
    rids = frozenset(req.rid for req in reqs)
    for entry in list(hooks.failed_samples):
        failed, err = entry
        if failed == rids or not failed:
            hooks.failed_samples.remove(entry)
            if failed:
                fail_requests(scheduler, reqs, hooks, "an engine step", err)


def _record_before_stream(original, self, reqs, *args, **kwargs):
    """record_before_stream: record new per-token values, finalise finished requests; a
    failure fails these requests, and the output is streamed all the same."""
    hooks = current()
    if hooks is not None:
        try:
            hooks.collector.record(reqs)
        except Exception as err:
            fail_requests(self, list(reqs), hooks, "recording per-token values", err)
    return original(self, reqs, *args, **kwargs)
