"""tunix's `VanillaRollout` with per-token entropy and logprobs, for comparisons and CI.

Owns `VanillaRolloutWithEntropy`: the cluster builds it like any rollout class
(`rollout_actor`, `tokenizer`, `mesh`, `rollout_config`); `generate` runs tunix's own
`VanillaRollout.generate`, then scores the sampled tokens once with the rollout model
(tunix's `compute_per_token_logps` and its logits, `tunix_compat.per_token_logps_and_logits`):
`logprobs` are the tempered logprobs that the vanilla sampler drew from (no top-k / top-p
there), `entropy` is the raw-distribution entropy computed by our sampler module
(`sampling.distribution.entropy_of_logits`). Its tokenizer gets the rollout's safe pad id
(`sgl_jax_rollout.pad_id`), which tunix's sampler masks prompts by.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from sgl_jax_rollout.pad_id import pad_safe
from sgl_jax_rollout.rollout import RolloutOutputWithEntropy
from sgl_jax_rollout.rollout_inputs import right_pad_ids
from sgl_jax_rollout.sampling.distribution import entropy_of_logits
from sgl_jax_rollout.tunix_compat import (
    CacheConfig,
    RolloutConfig,
    TokenizerAdapter,
    VanillaRollout,
    per_token_logps_and_logits,
)
from tunix_adapter.models import vocab_size


class VanillaRolloutWithEntropy(VanillaRollout):
    def __init__(self, rollout_actor: nnx.Module, tokenizer: Any, mesh: Any, rollout_config):
        del mesh  # the vanilla sampler runs where the actor's arrays live
        config = rollout_actor.config
        super().__init__(
            rollout_actor,
            # tunix's sampler masks prompts by the tokenizer's pad: the same safe one as ours
            # (build_cluster's tokenizer already has it).
            pad_safe(tokenizer, vocab_size(config), [TokenizerAdapter(tokenizer).eos_id()]),
            CacheConfig(
                cache_size=rollout_config.kv_cache_size,
                num_layers=config.num_layers,
                num_kv_heads=config.num_kv_heads,
                head_dim=config.head_dim,
            ),
        )

    def generate(
        self, prompts: list[str], rollout_config: RolloutConfig, **kwargs: Any
    ) -> RolloutOutputWithEntropy:
        # tunix's learners pass numpy str_ items, which HF fast tokenizers refuse.
        out = super().generate([str(p) for p in prompts], rollout_config, **kwargs)
        width = max(1, max(len(t) for t in out.tokens))
        completions = right_pad_ids(out.tokens, width, self.pad_id())
        graphdef, state = self._sampler.model_def_and_state()
        logps, logits = per_token_logps_and_logits(
            graphdef,
            state,
            jnp.asarray(out.left_padded_prompt_tokens),
            jnp.asarray(completions),
            self.pad_id(),
            self.eos_id(),
            rollout_config.temperature or 1.0,
        )
        # tunix divides the returned logits by the temperature; the raw entropy needs them back.
        raw = np.asarray(logits, np.float32) * (rollout_config.temperature or 1.0)
        entropy = np.asarray(entropy_of_logits(jnp.asarray(raw)))
        lengths = [len(t) for t in out.tokens]
        return RolloutOutputWithEntropy(
            text=out.text,
            logits=out.logits,
            tokens=out.tokens,
            left_padded_prompt_tokens=out.left_padded_prompt_tokens,
            logprobs=_rows(np.asarray(logps, np.float32), lengths),
            entropy=_rows(entropy, lengths),
        )


def _rows(values: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    return [values[i, :n].copy() for i, n in enumerate(lengths)]
