"""A trainer model whose logits leave in float32, as tunix main returns them in every family.

Owns `with_float32_logits`, `LOGITS_DTYPES` and `check_logits_dtype`. tunix 0.1.7's `Llama3`,
`Gemma` (Gemma 2) and `Gemma3` return the LM head's output in the activation dtype
(`models/llama3/model.py:665`, `models/gemma/model.py:940`, `models/gemma3/model.py:1026`:
bfloat16 for a bfloat16 model); its Qwen2 / 3 and Gemma 4 cast theirs to float32, and tunix
main (c7d8950f) casts in every family (`compute_final_logits`). `compute_per_token_logps`
(`rl/common.py:379-380`) then divides bfloat16 logits by the temperature in bfloat16 (0.7
becomes 0.69921875) and takes their log-softmax, so each trainer logprob carries the rounding
of its logits to a bfloat16 step (up to 0.03 nats where `|logit / T|` is 8 to 16), and where
XLA's fusions end decides whether the token's logit and the normaliser each see it (in one CPU
program the token's logit was rounded and the normaliser was not: not the log of any
distribution).

`with_float32_logits(model)` gives that one model a subclass of its own class whose
`__call__` casts the logits to float32 as they leave (after Gemma 2's soft-cap), tunix main's
order, so the trainer tempers and normalises in float32 as the engine's sampler does. It costs
float32's memory for the logits (twice bfloat16's), as on tunix main, so it is asked for
(`load_tunix_model(..., logits_dtype="float32")`), never implied. Other models of the class,
and float32 models, are unchanged; nnx's split / merge keep the subclass (its graph records it).
A class with tunix main's `compute_final_logits` (which casts, and which a `skip_lm_head` call
leaves to its caller) is left as it is.
"""

from __future__ import annotations

import functools
from typing import Any

LOGITS_DTYPES = (None, "float32")  # None: as tunix's model returns them


def check_logits_dtype(value: str | None, name: str = "logits_dtype") -> None:
    """Refuses, by the setting's `name`, a logits dtype other than `LOGITS_DTYPES`."""
    if value not in LOGITS_DTYPES:
        raise ValueError(f"{name} must be one of {list(LOGITS_DTYPES)}, got {value!r}")


def with_float32_logits(model: Any) -> Any:
    """`model` (a tunix nnx model, changed in place and returned), its logits float32."""
    cls = type(model)
    if not (getattr(cls, "_float32_logits", False) or hasattr(cls, "compute_final_logits")):
        model.__class__ = _float32_class(cls)
    return model


@functools.cache
def _float32_class(cls: type) -> type:
    import jax.numpy as jnp

    @functools.wraps(cls.__call__)  # its signature too: tunix reads which arguments it takes
    def __call__(self, *args, **kwargs):
        logits, *rest = cls.__call__(self, *args, **kwargs)
        return (logits.astype(jnp.float32), *rest)

    name = f"{cls.__name__}WithFloat32Logits"
    attributes = {"__call__": __call__, "__module__": __name__, "__qualname__": name}
    return type(name, (cls,), {**attributes, "_float32_logits": True})
