"""Benchmarks run by `sgl-jax-rollout bench ...`; each prints one JSON object."""
