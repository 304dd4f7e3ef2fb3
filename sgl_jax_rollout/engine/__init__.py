"""The in-process sgl-jax engine with our sampler: settings, patches, per-request stores.

`availability`, `settings`, `rows`, `collector`, `idle_work` and `cancel_scope` import no
sgl_jax; `patches`,
`sampler_module`, `weights`, `engine` and its collaborators (`requests`, `weight_updates`,
`memory_lifecycle`, `process`) need it (import them only once sgl_jax is installed).
"""

from sgl_jax_rollout.engine.settings import EngineSettings

__all__ = ["EngineSettings"]
