"""tunix 0.1.7's own `SglangJaxRollout`, as calls on the rollout benchmark's workloads.

Owns `sglang_jax_fields` (tunix's rollout config fields for our engine settings) and `build`
(`columns` builds it in a process of its own: our engine patches are
process-wide, and tunix's rollout must run on stock sgl-jax). Same engine settings and the
weights of the model directory (tunix loads them into its trainer model and syncs them to the
engine), and tunix's defaults otherwise (overlap scheduling on, as its users run it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any


def sglang_jax_fields(model_dir: Path, settings: dict) -> dict[str, Any]:
    """`RolloutConfig`'s `rollout_sglang_jax_*` fields for our engine settings (a dict with
    every `SETTINGS` key of the rollout benchmark)."""
    import jax

    return dict(
        rollout_sglang_jax_model_version=str(model_dir),
        rollout_sglang_jax_context_length=settings["context_length"],
        rollout_sglang_jax_disable_radix_cache=settings["disable_radix_cache"],
        rollout_sglang_jax_precompile_bs_paddings=list(settings["precompile_bs_paddings"]),
        rollout_sglang_jax_precompile_token_paddings=list(settings["precompile_token_paddings"]),
        rollout_sglang_jax_page_size=settings["page_size"],
        rollout_sglang_jax_max_running_requests=settings["max_running_requests"],
        rollout_sglang_jax_use_sort_for_toppk_minp=False,
        rollout_sglang_jax_log_level="error",
        rollout_sglang_jax_kwargs={
            "max_total_tokens": settings["max_total_tokens"],
            "max_prefill_tokens": settings["max_prefill_tokens"],
            "skip_server_warmup": True,
            "device": jax.default_backend(),
            "random_seed": 0,
        },
    )


def build(model_dir: Path, settings: dict, workloads: dict) -> dict[str, Callable[[], Any]]:
    """Per workload, one `generate` call of tunix's rollout."""
    import jax
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from sgl_jax_rollout.tunix_compat import TunixSglangJaxRollout as SglangJaxRollout
    from sgl_jax_rollout_apps.bench.workloads import prompts
    from tunix_adapter.models import load_tunix_model

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_tunix_model(model_dir)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"))
    config = RolloutConfig(
        max_tokens_to_generate=64,
        max_prompt_length=64,
        temperature=1.0,
        top_p=1.0,
        **sglang_jax_fields(model_dir, settings),
    )
    rollout = SglangJaxRollout(model, tokenizer, mesh, config)
    calls = {}
    for name, (count, lengths, new_tokens) in workloads.items():
        rc = RolloutConfig(**{**config.__dict__, "max_tokens_to_generate": new_tokens})
        calls[name] = functools.partial(
            rollout.generate, prompts(tokenizer, count, lengths), rc, ignore_eos=True
        )
    return calls
