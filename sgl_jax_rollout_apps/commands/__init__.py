"""The subcommands of `sgl-jax-rollout`: one module per command group.

Each module adds its subparser(s) to the top-level parser (`add_parser(s)`) and holds the
handler the subcommand runs; `sgl_jax_rollout_apps.cli` assembles them and dispatches. A
handler imports the library and the applications when it runs, never at module level, so that
`--help` and a missing engine are reported fast.
"""
