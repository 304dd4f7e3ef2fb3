"""sgl-jax-rollout applications: the `sgl-jax-rollout` command and what it runs.

Owns the command line (`cli`, which assembles `commands/`: one module a command group), the
demo (with its real tasks), `compare` (with `compare_stats`), the benchmarks (`bench/`) and the
one plotting module. Uses both the engine side (`sgl_jax_rollout`) and the
trainer side (`tunix_adapter`); neither imports it. Plots and progress bars need the `apps`
extra (matplotlib, tqdm).
"""
