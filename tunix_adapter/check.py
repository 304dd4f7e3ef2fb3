"""`sgl-jax-rollout check`: the pre-flight to run before spending a TPU-day on a checkpoint.

Owns `CheckConfig`, `run` and `verdicts`. Loads the trainer model (tunix, as training will) and
the engine on the same weights, then checks, on prompts long enough that positions pass
`prompt_tokens` (RoPE differences grow with position), of different lengths (so the batch the
trainer scores is left-padded as in training), each sampled `samples` times (a group, whose
copies share one prefill, as GRPO's do):

1. greedy: the engine's greedy tokens are the trainer's argmax at every position (a bfloat16
   engine: at 90% of them, a token whose trainer logprob is within the bfloat16 tolerance of
   the argmax's counting as agreeing: such near-ties are decided by rounding);
2. logprob fidelity at temperature 1 and 0.7: the engine's processed logprobs of its own
   samples against tunix's trainer-side `compute_per_token_logps`;
3. weight sync: after `update_params` with perturbed trainer weights (or perturbed LoRA
   adapters, as tunix syncs them), fidelity at temperature 1 again;
4. alignment: one logprob and one entropy per token, a stop (EOS) token only at the end,
   no pad id inside a completion, and pad id != EOS id;
5. with `--lora-rank`, the update the engine serves from small adapters (B ~ N(0, 1e-5), where
   most of `s * A @ B` is below half a bfloat16 step of `W`, so a merge rounded to a
   bfloat16 engine would drop it): the engine's effective `s * A @ B` per adapted module, read
   from its own weights, against the trainer's in float64 (relative error over all modules);
6. the pad id inside prompts: none of the tested prompts holds the pad id the rollout hands
   tunix (tunix would mask it as padding). Where the tokenizer has a chat template, the
   prompts are chat conversations (a system turn, an exchange, then the long user turn), so
   every turn-closing token is in them; where a prompt holds the pad, the row fails naming
   the id and no other check runs;
7. on a mixture of experts, the engine returns its routed experts and the trainer scores with
   them (routing replay, as training with `routing_replay=True` does): in bfloat16, rounding
   sends some tokens to another expert (the eighth and ninth of Qwen3-MoE's router are often
   close), which no tolerance meant for rounding covers. One more row gives the share of
   positions the trainer routes otherwise without replay (the largest layer's): 0 in float32,
   where a flip means a fault; reported, not judged, in bfloat16.

Each check gives one row with the measured value, its limit and a verdict; any failed row makes
the command exit non-zero. The float32 tolerance is 1e-4; a bfloat16 engine gets 0.1 (its
rounding, not a bug, dominates there: see the README's family table, and docs/guide.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

F32_TOLERANCE = 1e-4
BF16_TOLERANCE = 0.1
SENTENCE = "the quick brown fox jumps over the lazy dog while we check every number. "


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    model_path: str
    preset: str | None = None
    lora_rank: int = 0
    prompts: int = 2
    prompt_tokens: int = 1024  # the longest prompt: the completions' positions start past it
    samples: int = 2  # completions per prompt (tunix's num_generations)
    max_tokens: int = 32
    seed: int = 0
    engine_settings: Any = None  # overrides (a mapping of EngineSettings fields)

    def __post_init__(self) -> None:
        for name in ("prompts", "prompt_tokens", "max_tokens", "samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    check: str
    value: float
    limit: str
    ok: bool

    def row(self) -> str:
        return (
            f"{self.check:<54} {self.value:>10.3g}  {self.limit:<10} {'ok' if self.ok else 'FAIL'}"
        )


def _greedy_agrees(tokens: np.ndarray, logits: np.ndarray, near_tie: float) -> np.ndarray:
    """Per position: the engine's greedy token is the trainer's argmax, or its trainer logprob
    is within `near_tie` nats of the argmax's (a near-tie that rounding decides)."""
    logits = logits.astype(np.float64)
    top = logits.max(-1)
    chosen = np.take_along_axis(logits, tokens[:, None], -1)[:, 0]
    return (tokens == logits.argmax(-1)) | (top - chosen <= near_tie)


def run(config: CheckConfig, progress: Callable[[str], None] | None = None) -> list[Verdict]:
    """Builds trainer and engine for `config.model_path`, runs every check, shuts down.
    `progress` gets a line as each stage starts (the CLI prints them)."""
    say = progress or (lambda line: None)
    started = time.perf_counter()
    say(f"loading the trainer model and starting the engine for {config.model_path}")
    trainer, rollout, lora = _build(config)
    say(f"ready after {time.perf_counter() - started:.0f} s")
    try:
        return verdicts(config, rollout, trainer, lora, progress)
    finally:
        rollout.shutdown()


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
    from tunix_adapter.scoring import before_pad, replays, trainer_scores

    replay = replays(rollout, trainer)
    tolerance = BF16_TOLERANCE if _engine_dtype(rollout) == "bfloat16" else F32_TOLERANCE
    limit = f"<= {tolerance:g}"
    prompts = _long_prompts(rollout.engine.tokenizer, config.prompts, config.prompt_tokens)
    pad = rollout.pad_id()
    ids = rollout.prompt_token_ids(prompts, _rollout_config(config, 1.0).max_prompt_length)
    pad_row = pad_in_prompts(ids, pad, rollout.engine.tokenizer.convert_ids_to_tokens(pad))
    if not pad_row.ok:
        return [pad_row]
    outputs = []
    rows_of = (
        f"{len(ids)} prompts of {'/'.join(str(len(i)) for i in ids)} tokens x {config.samples}"
    )

    def fidelity(temperature: float) -> float:
        say(f"sampling and scoring at T={temperature:g} ({rows_of}, {config.max_tokens} new)")
        out = rollout.generate(prompts, _rollout_config(config, temperature), n=config.samples)
        outputs.append(out)
        reference, _ = trainer_scores(rollout, trainer, out, temperature, replay)
        return max(
            float(np.abs(np.asarray(lp)[:k] - reference[i, :k]).max(initial=0.0))
            for i, (lp, k) in enumerate(
                (lp, before_pad(t, pad)) for lp, t in zip(out.logprobs, out.tokens, strict=True)
            )
        )

    say(f"greedy tokens against the trainer's argmax ({rows_of}, {config.max_tokens} new)")
    greedy = rollout.generate(
        prompts, _rollout_config(config, 1.0), temperature=0.0, n=config.samples
    )
    outputs.append(greedy)
    _, logits = trainer_scores(rollout, trainer, greedy, 1.0, replay)
    near_tie = 0.0 if tolerance == F32_TOLERANCE else tolerance
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
    for temperature in (1.0, 0.7):
        diff = fidelity(temperature)
        rows.append(
            Verdict(f"logprob |diff| vs trainer, T={temperature}", diff, limit, diff <= tolerance)
        )
    if replay:
        flipped = float(
            routing_replay.own_routing_mismatch(
                trainer, outputs[1], rollout.pad_id(), rollout.eos_id()
            ).max()
        )
        judged = tolerance == F32_TOLERANCE
        rows.append(
            Verdict(
                "MoE: positions routed otherwise without replay",
                flipped,
                "== 0" if judged else "reported",
                flipped == 0 or not judged,
            )
        )

    kind = nnx.LoRAParam if lora else nnx.Param
    say("update_params with perturbed " + ("LoRA adapters" if lora else "weights"))
    state = nnx.state(trainer, kind)
    nnx.update(trainer, perturbed(state, scale=0.05, seed=config.seed + 1))
    rollout.update_params(nnx.state(trainer, kind), (kind,))
    diff = fidelity(1.0)
    what = "LoRA adapters" if lora else "weights"
    rows.append(
        Verdict(f"after update_params (perturbed {what}), T=1.0", diff, limit, diff <= tolerance)
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
                f"LoRA update served, small B (rel. error, {_engine_dtype(rollout)})",
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


def pad_in_prompts(prompt_ids: list[list[int]], pad: int, token: str | None) -> Verdict:
    """The row for the pad id inside the tested prompts: how many hold it (tunix would read
    those tokens as padding), named by id."""
    holding = sum(pad in ids for ids in prompt_ids)
    return Verdict(f"prompts holding the pad id {pad} ({token})", holding, "== 0", not holding)


def small_adapters(adapters: Any, seed: int, sigma: float = 1e-5) -> Any:
    """`adapters` with every B factor drawn from N(0, sigma): an early LoRA update."""
    import jax

    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            jax.numpy.asarray(rng.normal(0.0, sigma, x.shape), x.dtype)
            if "_lora_b" in jax.tree_util.keystr(path)
            else x
        ),
        adapters,
    )


def lora_update_error(rollout, trainer) -> float:
    """‖engine's s·A@B − trainer's s·A@B‖ / ‖trainer's‖ over every adapted module, in float64.

    The engine's update is read from its own weights (its static LoRA buffers, in its dtype),
    so whatever it serves is what is measured; the trainer's is qwix's `alpha / rank * A @ B`
    with each module's scaling from the rollout's LoRA layout."""
    import re

    from flax import nnx

    from sgl_jax_rollout.engine.gemma_mapping import engine_modules
    from sgl_jax_rollout.engine.lora import LORA_A, LORA_B, factor_pairs
    from sgl_jax_rollout.engine.moe_mapping import engine_module

    layout = rollout.engine.lora
    engine = {".".join(map(str, p)): v.value for p, v in rollout.engine.engine_state().flat_state()}
    num = den = 0.0
    for target, pair in factor_pairs(nnx.state(trainer, nnx.LoRAParam)).items():
        a, b = (np.asarray(pair[k], np.float64) for k in (LORA_A, LORA_B))
        rank = a.shape[-1]
        expected = layout.scaling(target) * a.reshape(-1, rank) @ b.reshape(rank, -1)
        layer, module = target.split(".")[1], target.split(".")[-2]
        served = []  # one tunix module may feed several engine modules (Gemma's kv_einsum)
        for fed in engine_modules(module):
            served_by = engine_module(rollout.engine.model_type, fed)  # Qwen3-MoE: c_proj
            prefix = next(
                name.removesuffix(".A_buffer")
                for name in engine
                if re.fullmatch(rf"model\.layers\.{layer}\.\w+\.{served_by}\.A_buffer", name)
            )
            a_buf, b_buf = (np.asarray(engine[f"{prefix}.{k}_buffer"][0], np.float64) for k in "AB")
            served.append((b_buf @ a_buf).T)
        served = np.concatenate(served, axis=1)
        num += float(((served - expected) ** 2).sum())
        den += float((expected**2).sum())
    return (num / den) ** 0.5


def perturbed(state: Any, scale: float, seed: int) -> Any:
    """`state` plus seeded normal noise of `scale` times each leaf's standard deviation (at
    least `scale` for constant leaves such as norms and zero-initialised LoRA factors).

    One jitted program: with one JAX process per host, a run of small eager ops on arrays that
    span processes (each reduction a collective) can interleave its collectives differently in
    each process on CPU, and hang."""
    import functools

    import jax

    leaves, treedef = jax.tree_util.tree_flatten(state)

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def noisy(leaves: list, scale: float, seed: int) -> list:
        keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
        out = []
        for x, key in zip(leaves, keys, strict=True):
            sigma = x.std()
            sigma = jax.numpy.where(sigma > 0, sigma, 1.0)
            out.append(x + (scale * sigma * jax.random.normal(key, x.shape)).astype(x.dtype))
        return out

    return jax.tree_util.tree_unflatten(treedef, noisy(leaves, scale, seed))


def table(rows: list[Verdict]) -> str:
    header = f"{'check':<54} {'value':>10}  {'limit':<10} verdict"
    return "\n".join([header, *(r.row() for r in rows)])


def _build(config: CheckConfig):
    """(trainer, rollout, lora spec or None) on the preset's meshes, or one device."""
    import jax
    from flax import nnx

    from sgl_jax_rollout.engine.settings import EngineSettings
    from sgl_jax_rollout.rollout import SglangJaxRollout
    from tunix_adapter import routing_replay
    from tunix_adapter.cluster import lora_scaling, with_lora
    from tunix_adapter.models import load_tunix_model

    model_path = _model_dir(config)
    context, prefill, batch = _room(config)
    rollout_mesh = None
    if config.preset:
        import tpu_configs

        preset = tpu_configs.load(config.preset)
        preset.check_devices()
        preset.check_model(model_path)
        mesh, rollout_mesh = preset.meshes()
        settings = preset.engine_settings()
        settings = settings.replace(context_length=max(settings.context_length, context))
    else:
        mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        settings = EngineSettings(
            context_length=context,
            max_prefill_tokens=prefill,
            precompile_token_paddings=(prefill,),
            max_running_requests=batch,
            precompile_bs_paddings=(batch,),
            max_total_tokens=4 * prefill,
        )
    trainer = load_tunix_model(model_path, mesh)
    if routing_replay.moe_layers(trainer):  # the trainer scores with the rollout's experts
        settings = settings.replace(return_routed_experts=True)
    settings = settings.replace(**dict(config.engine_settings or {}))
    lora = None
    if config.lora_rank:
        lora = {"rank": config.lora_rank, "alpha": 2.0 * config.lora_rank, "seed": config.seed}
        trainer = with_lora(trainer, lora, mesh)
        # Trained-looking adapters (B starts at zero, which would make any merge look right).
        adapters = nnx.state(trainer, nnx.LoRAParam)
        nnx.update(trainer, perturbed(adapters, scale=0.05, seed=config.seed))
    rollout = SglangJaxRollout(
        rollout_actor=trainer,
        mesh=rollout_mesh,
        model_path=model_path,
        engine_settings=settings,
        lora_scaling=lora_scaling(lora),
    )
    return trainer, rollout, lora


def _room(config: CheckConfig) -> tuple[int, int, int]:
    """(context length, prefill tokens, batch size), powers of two, that hold every prompt of
    up to `prompt_tokens` with its completion, and every row: all prompts in one prefill, then
    a token for each of their copies (the engine prefills a group's prompt once)."""
    longest = config.prompt_tokens + 16 + config.max_tokens
    rows = config.prompts * config.samples
    return (
        1 << (longest + 63).bit_length(),
        1 << (config.prompts * longest + rows - 1).bit_length(),
        1 << (rows - 1).bit_length(),
    )


def _rollout_config(config: CheckConfig, temperature: float):
    from sgl_jax_rollout.tunix_compat import RolloutConfig

    return RolloutConfig(
        max_tokens_to_generate=config.max_tokens,
        max_prompt_length=config.prompt_tokens + 16,
        temperature=temperature,
        top_p=1.0,
        top_k=None,
        seed=config.seed,
        return_logprobs=True,
    )


def _engine_dtype(rollout) -> str:
    import jax

    leaves = jax.tree_util.tree_leaves(rollout.engine.engine_state())
    return str(next(x.dtype for x in leaves if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)))


def _long_prompts(tokenizer, count: int, tokens: int) -> list[str]:
    """`count` different prompts, the first of about `tokens` tokens (cut to `tokens + 16`),
    each next one shorter by a quarter of that over `count` (so a batch of them is left-padded):
    chat conversations where the tokenizer has a chat template (`CHAT_OPENING`, then the text
    as the last user turn), plain text otherwise."""
    opening = _chat(tokenizer, "")
    overhead = len(tokenizer.encode(opening, add_special_tokens=False)) if opening else 0
    length = max(1, tokens - overhead)
    step = length // (4 * count)
    per_sentence = len(tokenizer.encode(SENTENCE, add_special_tokens=False))
    repeats = (length + count) // per_sentence + 2
    ids = tokenizer.encode(SENTENCE * repeats, add_special_tokens=False)
    texts = [tokenizer.decode(ids[i : i + max(1, length - i * step)]) for i in range(count)]
    return [_chat(tokenizer, text) or text for text in texts]


CHAT_OPENING = [
    {"role": "system", "content": "You check numbers."},
    {"role": "user", "content": "Say yes."},
    {"role": "assistant", "content": "yes"},
]


def _chat(tokenizer, text: str) -> str | None:
    """`text` as the last user turn of `CHAT_OPENING` in the tokenizer's chat template (None
    without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [*CHAT_OPENING, {"role": "user", "content": text}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja2's TemplateError, raised by the template itself
        if "system" not in str(err).lower():
            raise
    # A template without a system role (Gemma's): the system text opens the first user turn,
    # as Gemma's model card does it.
    system, first, *rest = messages
    folded = {"role": "user", "content": system["content"] + "\n\n" + first["content"]}
    return tokenizer.apply_chat_template(
        [folded, *rest], tokenize=False, add_generation_prompt=True
    )


def _model_dir(config: CheckConfig) -> Path:
    path = Path(config.model_path)
    if not (path / "config.json").is_file():
        raise ValueError(f"--model-path must be a model directory with config.json: {path}")
    return path
