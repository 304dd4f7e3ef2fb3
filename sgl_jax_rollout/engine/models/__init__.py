"""Model classes sgl-jax lacks at the pinned commit, one module each, written to be sent upstream.

Owns nothing but the package: each module is an sgl-jax model (its `EntryClass`, the shape of
`sgl_jax/srt/models/*.py`) built from sgl-jax's own layers, which it reaches through
`engine.upstream` (where a copy sent upstream imports them from `sgl_jax.srt` instead), and
imports nothing else of this project. `engine.patches.models` registers them in sgl-jax's
model registry at engine start.
"""
