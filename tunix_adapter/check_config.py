"""The pre-flight's settings: `CheckConfig` and what follows from it alone.

Owns `CheckConfig` (checked at construction), the `RolloutConfig` each check samples with
(`rollout_config`) and the engine's room for the prompts and their copies (`room`). It must
not build or run anything (`check.py` does).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tunix_adapter.logits_dtype import check_logits_dtype

TRAINER_DTYPES = (None, "float32", "bfloat16")


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
    trainer_dtype: str | None = None  # None: the engine's (see `check.py`)
    trainer_logits_dtype: str | None = None  # None: tunix's model's (`load_tunix_model`)

    def __post_init__(self) -> None:
        for name in ("prompts", "prompt_tokens", "max_tokens", "samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.trainer_dtype not in TRAINER_DTYPES:
            raise ValueError(
                f"trainer_dtype must be one of {list(TRAINER_DTYPES)}, got {self.trainer_dtype!r}"
            )
        check_logits_dtype(self.trainer_logits_dtype, "trainer_logits_dtype")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")


def room(config: CheckConfig) -> tuple[int, int, int]:
    """(context length, prefill tokens, batch size), powers of two, that hold every prompt of
    up to `prompt_tokens` with its completion, and every row: all prompts in one prefill, then
    a token for each of their copies (the engine prefills a group's prompt once); the prefill
    at least the context, as `EngineSettings` asks."""
    longest = config.prompt_tokens + 16 + config.max_tokens
    rows = config.prompts * config.samples
    context = 1 << (longest + 63).bit_length()
    return (
        context,
        max(context, 1 << (config.prompts * longest + rows - 1).bit_length()),
        1 << (rows - 1).bit_length(),
    )


def rollout_config(config: CheckConfig, temperature: float):
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
