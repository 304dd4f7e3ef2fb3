"""sgl-jax-rollout, trainer side: tunix models, cluster wiring, learners and the pre-flight check.

Uses `sgl_jax_rollout`; never imported by it. Imports nothing from the applications
(`sgl_jax_rollout_apps`), which use it.
"""
