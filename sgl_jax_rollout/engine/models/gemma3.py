"""Gemma 3 text (`Gemma3ForCausalLM`, HF model_type `gemma3_text`) for sgl-jax, on its Gemma 2.

Owns `Gemma3ForCausalLM`, `Gemma3ForConditionalGeneration` (the same model on a multimodal
checkpoint's `text_config`, its weights under `language_model.`; both in `EntryClass`), their
attention and `LinearScalingRotaryEmbedding` (HF's "linear" `rope_scaling`, which sgl-jax's
`get_rope` lacks at cddbf6f1). Checked against transformers 4.57
`models/gemma3/modeling_gemma3.py`. Gemma 3 is Gemma 2's decoder with:

- q / k RMSNorm over head_dim, Gemma's `x * (1 + w)`, after the projections and before RoPE;
- each layer's kind from the config's `layer_types` (`sliding_attention` / `full_attention`;
  five windowed to one full in the checkpoints): windowed layers attend `sliding_window` keys
  (`RadixAttention.sliding_window_size`, from which sgl-jax builds its hybrid KV pool,
  `model_runner.py:160-168, 938-970`), full layers every key;
- a RoPE base per kind: `rope_local_base_freq` (10k) on windowed layers, `rope_theta` (1M) on
  full ones, which alone take the config's `rope_scaling` (linear, factor 8 on 4B and up);
- no attention or final-logit soft-cap (null in the checkpoints' configs).

The same as Gemma 2, and inherited from sgl-jax's `srt/models/gemma2.py`: queries scaled by
`query_pre_attn_scalar ** -0.5`, the embedding times sqrt(hidden) in the model's dtype, the
four norms around attention and MLP (`Gemma2DecoderLayer.__call__`), the tanh-GeLU MLP
(`Gemma2MLP`), tied embeddings, HF's weight names (`_create_weight_mappings`, plus the q / k
norms). sgl-jax's layers come through `engine.upstream` (checked at engine start); a copy sent
upstream imports the same names from `sgl_jax.srt`, brings `utils.model_dir.checkpoint_prefix`
(twenty lines) along, and is otherwise this file.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sgl_jax_rollout.engine import upstream
from sgl_jax_rollout.utils.model_dir import LANGUAGE_MODEL_PREFIXES, checkpoint_prefix

Embed = upstream.get("Embed")
Gemma2DecoderLayer = upstream.get("Gemma2DecoderLayer")
Gemma2ForCausalLM = upstream.get("Gemma2ForCausalLM")
Gemma2MLP = upstream.get("Gemma2MLP")
Gemma2Model = upstream.get("Gemma2Model")
GemmaRMSNorm = upstream.get("GemmaRMSNorm")
LinearBase = upstream.get("LinearBase")
LogitsProcessor = upstream.get("LogitsProcessor")
RadixAttention = upstream.get("RadixAttention")
RotaryEmbedding = upstream.get("RotaryEmbedding")
WeightMapping = upstream.get("WeightMapping")

SLIDING, FULL = "sliding_attention", "full_attention"


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    """RoPE with HF's "linear" scaling: positions divided by `scaling_factor`, i.e. every
    inverse frequency divided by it (`modeling_rope_utils._compute_linear_scaling_rope_parameters`).
    The phases read `_inv_freq_np` (numpy, so it stays concrete inside a model-building trace),
    or are computed by the engine's `rope_phases` rule, the phase divided by the factor."""

    linear_phase_scaling = True

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: jnp.dtype,
        scaling_factor: float,
    ):
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype)
        self.scaling_factor = float(scaling_factor)
        self._inv_freq_np = self._inv_freq_np / self.scaling_factor

    def _compute_inv_freq(self, base: float) -> jax.Array:
        return super()._compute_inv_freq(base) / self.scaling_factor


def layer_kinds(config: Any) -> list[str]:
    """Each layer's kind: the config's `layer_types`, else HF's default from
    `sliding_window_pattern` (every pattern-th layer full, 6 when absent)."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return list(kinds)
    pattern = getattr(config, "sliding_window_pattern", None) or 6
    return [SLIDING if (i + 1) % pattern else FULL for i in range(config.num_hidden_layers)]


def rotary_embedding(config: Any, kind: str, dtype: jnp.dtype) -> Any:
    """The rotary embedding of a `kind` layer: `rope_local_base_freq` unscaled on windowed
    layers (HF's `rotary_emb_local`), `rope_theta` with the config's `rope_scaling` on full
    ones. Raises ValueError for a scaling other than "linear" (or "default", none)."""
    head_dim = config.head_dim
    if kind == SLIDING:
        base, scaling = config.rope_local_base_freq, None
    else:
        base, scaling = config.rope_theta, getattr(config, "rope_scaling", None)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return RotaryEmbedding(
            head_dim, head_dim, config.max_position_embeddings, base, True, dtype
        )
    if rope_type != "linear":
        raise ValueError(
            f"Gemma3ForCausalLM applies rope_scaling of type 'linear' (or none), got {scaling!r}"
        )
    return LinearScalingRotaryEmbedding(
        head_dim, head_dim, config.max_position_embeddings, base, True, dtype, scaling["factor"]
    )


class Gemma3Attention(nnx.Module):
    """Gemma 2's attention with q / k norms before RoPE, a RoPE per layer kind, no soft-cap."""

    def __init__(
        self, config: Any, layer_id: int, kind: str, mesh: jax.sharding.Mesh, dtype: jnp.dtype
    ):
        self.layer_id = layer_id
        self.mesh = mesh
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim

        def linear(size_in: int, size_out: int, axes: tuple) -> Any:
            return LinearBase(
                input_size=size_in,
                output_size=size_out,
                use_bias=bias,
                kernel_axes=axes,
                params_dtype=dtype,
                mesh=mesh,
            )

        self.q_proj = linear(hidden, q_size, (None, "tensor"))
        self.k_proj = linear(hidden, kv_size, (None, "tensor"))
        self.v_proj = linear(hidden, kv_size, (None, "tensor"))
        self.o_proj = linear(q_size, hidden, ("tensor", None))
        self.q_norm = GemmaRMSNorm(self.head_dim, epsilon=config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, epsilon=config.rms_norm_eps)
        self.rotary_emb = rotary_embedding(config, kind, dtype)
        self.attn = RadixAttention(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            scaling=config.query_pre_attn_scalar**-0.5,
            num_kv_heads=self.num_kv_heads,
            layer_id=layer_id,
            sliding_window_size=config.sliding_window if kind == SLIDING else 0,
            logit_cap=config.attn_logit_softcapping or 0,
        )

    def __call__(
        self, hidden_states: jax.Array, forward_batch: Any, token_to_kv_pool: Any
    ) -> tuple[jax.Array, Any]:
        q, _ = self.q_proj(hidden_states)
        k, _ = self.k_proj(hidden_states)
        v, _ = self.v_proj(hidden_states)
        # Heads on the tensor axis, as sgl-jax's Gemma 4 reshapes them (with one KV head the
        # reshape alone would leave the tensor axis on head_dim).
        heads = NamedSharding(self.mesh, P("data", "tensor", None))
        q = self.q_norm(q.reshape(-1, self.num_heads, self.head_dim, out_sharding=heads))
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_dim, out_sharding=heads))
        v = v.reshape(-1, self.num_kv_heads, self.head_dim, out_sharding=heads)
        q, k = self.rotary_emb(forward_batch.positions, q, k)
        attn_output, kv_fused = self.attn(
            q, k, v, forward_batch=forward_batch, token_to_kv_pool=token_to_kv_pool
        )
        output, _ = self.o_proj(attn_output)
        return output, kv_fused


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    """Gemma 2's block (its `__call__`: the four norms, the residuals) around Gemma 3's
    attention; the MLP is Gemma 2's."""

    def __init__(self, config: Any, mesh: jax.sharding.Mesh, layer_id: int = 0, dtype=jnp.bfloat16):
        self.layer_id = layer_id
        kind = layer_kinds(config)[layer_id]
        self.self_attn = Gemma3Attention(config, layer_id, kind, mesh, dtype)
        self.mlp = Gemma2MLP(
            config.hidden_size, config.intermediate_size, mesh=mesh, layer_id=layer_id, dtype=dtype
        )
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, epsilon=eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, epsilon=eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, epsilon=eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, epsilon=eps)


class Gemma3Model(Gemma2Model):
    """Gemma 2's model (its `__call__`: the embedding times sqrt(hidden) in the model's dtype,
    the layers, the final norm) over Gemma 3's layers."""

    def __init__(self, config: Any, mesh: jax.sharding.Mesh, dtype=jnp.bfloat16):
        self.embed_tokens = Embed(
            config.vocab_size,
            config.hidden_size,
            dtype=dtype,
            param_dtype=dtype,
            kernel_axes=("tensor", None),
            mesh=mesh,
        )
        self.layers = nnx.data(
            [
                Gemma3DecoderLayer(config, layer_id=i, dtype=dtype, mesh=mesh)
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = GemmaRMSNorm(config.hidden_size, epsilon=config.rms_norm_eps)
        self.hidden_size = config.hidden_size


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 text: Gemma 2's causal LM (forward, tied output, weight loading) over
    `Gemma3Model`, with the q / k norms' weights mapped too."""

    def __init__(self, config: Any, mesh: jax.sharding.Mesh, dtype=jnp.bfloat16):
        activation = getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh"
        if activation != "gelu_pytorch_tanh":
            raise ValueError(
                "Gemma3ForCausalLM computes the tanh GeLU (hidden_activation "
                f"'gelu_pytorch_tanh') only, got {activation!r}"
            )
        self.mesh = mesh
        self.config = config
        self.dtype = dtype
        self.model = Gemma3Model(config, dtype=dtype, mesh=mesh)
        self.logits_processor = LogitsProcessor(
            config.vocab_size, soft_cap=config.final_logit_softcapping, mesh=mesh
        )

    def _create_layer_mappings(self, layer_idx: int) -> dict:
        mappings = super()._create_layer_mappings(layer_idx)
        prefix = f"model.layers.{layer_idx}.self_attn"
        for norm in ("q_norm", "k_norm"):
            mappings[f"{prefix}.{norm}.weight"] = WeightMapping(
                target_path=f"{prefix}.{norm}.weight", sharding=(None,), transpose=False
            )
        return mappings


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The text part of a multimodal Gemma 3 checkpoint (4B, 12B, 27B): `Gemma3ForCausalLM` on
    the config's `text_config`, its weights read under the prefix the checkpoint uses
    (`utils.model_dir.checkpoint_prefix`). The vision tower and the projector are not loaded:
    prompts are text only."""

    def __init__(self, config: Any, mesh: jax.sharding.Mesh, dtype=jnp.bfloat16):
        super().__init__(config.text_config, mesh, dtype)
        self.weight_prefix = LANGUAGE_MODEL_PREFIXES[0]

    def load_weights(self, model_config: Any) -> None:
        self.weight_prefix = checkpoint_prefix(model_config.model_path, self.__class__.__name__)
        super().load_weights(model_config)

    def _create_weight_mappings(self) -> dict:
        text = super()._create_weight_mappings()
        return {name.replace("model.", self.weight_prefix, 1): m for name, m in text.items()}


EntryClass = [Gemma3ForCausalLM, Gemma3ForConditionalGeneration]
