"""`sgl-jax-rollout check`'s engine and trainer flags reach the check's config (the check
itself, replaced here by a test double that records its config, runs in
tests/tunix_adapter/test_check_engine.py and test_families_engine.py)."""

from sgl_jax_rollout_apps import cli
from sgl_jax_rollout_apps.commands import check as check_command


def test_page_size_attention_and_dtype_flags_reach_the_engine_settings(monkeypatch):
    from tunix_adapter import check

    seen = []
    monkeypatch.setattr(check_command, "engine_missing", lambda *args: False)
    monkeypatch.setattr(check, "run", lambda config, progress=None: seen.append(config) or [])
    flags = ["--page-size", "64", "--native-attention", "upstream", "--dtype", "bfloat16"]
    assert cli.main(["check", "--model-path", "m", *flags]) == 0
    assert cli.main(["check", "--model-path", "m"]) == 0
    assert seen[0].engine_settings == {
        "dtype": "bfloat16",
        "page_size": 64,
        "native_attention": "upstream",
    }
    assert seen[1].engine_settings == {}
    assert (seen[1].prompts, seen[1].samples) == (2, 2)  # several rows, left-padded, a group
    assert cli.main(["check", "--model-path", "m", "--prompts", "3", "--samples", "4"]) == 0
    assert (seen[2].prompts, seen[2].samples) == (3, 4)
    assert seen[2].trainer_logits_dtype is None
    assert cli.main(["check", "--model-path", "m", "--trainer-logits-dtype", "float32"]) == 0
    assert seen[3].trainer_logits_dtype == "float32"
