"""`engine/upstream.py`, the one seam to sgl-jax: the pinned commit passes its check, and a
name, parameter, attribute or `ServerArgs` field that moved is named at start."""

from __future__ import annotations

import pytest

from sgl_jax_rollout.engine import upstream

pytestmark = pytest.mark.engine


def test_the_pinned_sgl_jax_passes_the_check_with_our_server_args():
    from sgl_jax_rollout.engine.settings import EngineSettings

    upstream.check(EngineSettings().server_args("/model", "cpu"))


@pytest.mark.parametrize(
    ("registry", "key", "value", "named"),
    [
        ("SYMBOLS", "Gone", ("managers.scheduler", "NoSuchClass"), "NoSuchClass is gone"),
        ("FUNCTIONS", "Scheduler.run_batch", ("self", "batch", "no_such_param"), "no_such_param"),
        ("FUNCTIONS", "Scheduler.no_such_method", ("self",), "Scheduler.no_such_method is gone"),
        ("ATTRIBUTES", "Req", ("rid", "no_such_attribute"), "['no_such_attribute']"),
        ("MODULE_GLOBALS", "managers.scheduler", ("no_such_global",), "['no_such_global']"),
    ],
)
def test_a_moved_upstream_name_fails_the_check_naming_it(monkeypatch, registry, key, value, named):
    monkeypatch.setitem(getattr(upstream, registry), key, value)
    with pytest.raises(RuntimeError, match="differs from the commit") as err:
        upstream.check()
    assert named in str(err.value)


def test_an_engine_keyword_serverargs_lacks_fails_the_check():
    with pytest.raises(RuntimeError, match=r"ServerArgs has no field\(s\) \['no_such_arg'\]"):
        upstream.check(["model_path", "no_such_arg"])


def test_instance_attributes_are_read_from_assignments_over_the_mro():
    class Base:
        shared = 1

        def __init__(self):
            self.set_in_init = 0

    class Child(Base):
        def later(self):
            self.set_later: int = 2
            self.counter += 1
            self.pair_a, self.pair_b = 1, 2

    known = upstream.class_attributes(Child)
    for name in ("shared", "set_in_init", "set_later", "counter", "pair_a", "pair_b", "later"):
        assert name in known
    assert "never_set" not in known


def test_every_attribute_we_read_exists_on_live_engine_objects(rollout):
    """The static reading agrees with the objects a running engine built."""
    engine = rollout.engine
    scheduler = upstream.scheduler_of(engine._engine)
    runner = upstream.model_runner_of(scheduler)
    live = {
        "Engine": engine._engine,
        "Scheduler": scheduler,
        "ModelRunner": runner,
        "ServerArgs": scheduler.server_args,
        "ReqToTokenPool": runner.req_to_token_pool,
    }
    for name, obj in live.items():
        missing = [a for a in upstream.ATTRIBUTES[name] if not hasattr(obj, a)]
        assert not missing, f"{name}: {missing}"


def test_the_running_engines_rotary_embeddings_round_their_phases_as_tunix(rollout):
    """`EngineSettings.rope_phases` (default "trainer") reaches the model the engine built: every
    layer's rotary embedding (the built-in Qwen3's plain RoPE) computes by tunix's qwen3 rule
    while the engine runs."""
    from sgl_jax_rollout.engine.patches.agreement import phase_rule

    runner = upstream.model_runner_of(upstream.scheduler_of(rollout.engine._engine))
    rules = {phase_rule(layer.self_attn.rotary_emb) for layer in runner.model.model.layers}
    assert rules == {"timescale"}
