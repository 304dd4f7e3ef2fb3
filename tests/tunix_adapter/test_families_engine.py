"""The model families users train, as tiny float32 replicas of their configs (`--like`), each
through the `check` pre-flight at the TPU presets' KV page size (64; the suite's other engines
run at 1): greedy tokens, processed logprobs at T 1 and 0.7 over completions past position
1,024 (and of a shorter prompt: the trainer's batch left-padded), 2 samples a prompt (a group
sharing one prefill; Gemma 4's hybrid sliding-window pool too), and one sync of perturbed
weights, all against tunix's trainer-side `compute_per_token_logps`; for Gemma and Qwen3-MoE
(mappings of our own) also LoRA syncs (engine-marked; one engine at a time, each shut down
before the session rollout starts (tests/conftest.py)).
"""

from __future__ import annotations

import pytest

from sgl_jax_rollout.tiny_model import LIKE_PRESETS

pytestmark = pytest.mark.engine

PRESET_PAGE_SIZE = 64  # tpu_configs' presets: 64 or 128


@pytest.mark.parametrize("like", sorted(LIKE_PRESETS))
def test_each_family_agrees_with_the_tunix_trainer_past_position_1024(like, tmp_path):
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from tunix_adapter import check

    model_dir = make_tiny_model(tmp_path / like, like=like, dtype="float32")
    rows = check.run(
        check.CheckConfig(
            model_path=str(model_dir),
            prompts=2,
            samples=2,
            prompt_tokens=1024,
            max_tokens=16,
            engine_settings={"page_size": PRESET_PAGE_SIZE},
        )
    )
    failed = [f"{row.check}: {row.value:.3g} (limit {row.limit})" for row in rows if not row.ok]
    assert not failed, f"{like}: " + "; ".join(failed)


OWN_MAPPINGS = sorted(n for n in LIKE_PRESETS if n.startswith("gemma-") or "-a3b" in n)


@pytest.mark.parametrize("like", OWN_MAPPINGS)
def test_lora_syncs_agree_with_the_tunix_trainer(like, tmp_path):
    """qwix adapters on the attention (and Gemma's MLP) served by the engine's q/k/v/o
    projections (Qwen3-MoE's o_proj is sgl-jax's `c_proj`): logprobs after a sync of perturbed
    adapters, and small adapters served whole; Gemma's over prompts past twice the sliding
    window. Gemma 4 needs the
    `lora_text_config` and `lora_buffers_per_layer` patches: without either the engine does
    not start (its config is nested; its full layers' q/k/o adapters are twice as wide)."""
    from sgl_jax_rollout.tiny_model import make_tiny_model
    from tunix_adapter import check

    model_dir = make_tiny_model(tmp_path / like, like=like, dtype="float32")
    rows = check.run(
        check.CheckConfig(
            model_path=str(model_dir), prompts=1, prompt_tokens=600, max_tokens=16, lora_rank=4
        )
    )
    names = [row.check for row in rows]
    assert "after update_params (perturbed LoRA adapters), T=1.0" in names
    failed = [f"{row.check}: {row.value:.3g} (limit {row.limit})" for row in rows if not row.ok]
    assert not failed, f"{like}: " + "; ".join(failed)
