"""The tunix seam (`sgl_jax_rollout/tunix_compat.py`): every name resolves on the installed
tunix with the members we use, and a missing name or member fails on import with its name."""

from __future__ import annotations

import pytest

from sgl_jax_rollout import tunix_compat


def test_every_name_and_member_resolves_on_the_installed_tunix():
    tunix_compat.check_all()
    assert tunix_compat.GRPOLearner.__name__ == "GRPOLearner"
    assert tunix_compat.RolloutConfig(max_tokens_to_generate=4).max_tokens_to_generate == 4


def test_a_missing_name_fails_with_its_name_and_where_it_was_looked_for(monkeypatch):
    monkeypatch.setitem(
        tunix_compat.SYMBOLS,
        "Gone",
        (("tunix.rl.rl_cluster", "NoSuchClass"), ("tunix.no_such_module", "Gone")),
    )
    with pytest.raises(tunix_compat.TunixIncompatible, match="has no Gone") as err:
        tunix_compat.check_all(("Gone",))
    assert "tunix.rl.rl_cluster.NoSuchClass" in str(err.value)
    assert "tunix.no_such_module (no such module)" in str(err.value)


def test_a_missing_member_fails_on_import_with_its_name(monkeypatch):
    monkeypatch.setitem(tunix_compat.MEMBERS, "GRPOLearner", ("_compute_rewards", "_renamed"))
    monkeypatch.delitem(tunix_compat._RESOLVED, "GRPOLearner", raising=False)
    with pytest.raises(tunix_compat.TunixIncompatible, match="GRPOLearner has no _renamed"):
        tunix_compat.check_all(("GRPOLearner",))


def test_attributes_set_in_init_count_as_members_and_others_do_not():
    cluster = tunix_compat.RLCluster
    assert tunix_compat._has_member(cluster, "_anchor_policy_state")  # set in __init__
    assert not tunix_compat._has_member(cluster, "_no_such_state")


def test_model_modules_resolve_and_a_missing_family_is_named():
    assert hasattr(tunix_compat.model_module("qwen3", "model"), "ModelConfig")
    with pytest.raises(tunix_compat.TunixIncompatible, match="tunix.models.nofamily.model"):
        tunix_compat.model_module("nofamily", "model")
