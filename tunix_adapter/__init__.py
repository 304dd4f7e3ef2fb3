"""sgl-jax-rollout, trainer side: tunix models, cluster wiring and learners.

Uses `sgl_jax_rollout`; never imported by it.
"""
