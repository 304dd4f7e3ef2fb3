"""The README's figures, checked against a fresh run (`sgl-jax-rollout figures`).

`spec` defines a figure and its source and judges one against an output, `registry` lists the
README's figures with the command that measures each and its noise, `runner` runs the commands
and reports. `tests/sgl_jax_rollout_apps/test_figures.py` keeps the registry and the README in
step: a figure changed in one and not the other fails it.
"""
