"""Old policy, off-policy corrections and forking tokens in real GRPO steps on SglangJaxRollout
(engine-marked; builds its own cluster and engine, before the session rollout starts).

At temperature 0.7 with `num_iterations=2` (tunix 0.1.7 then asks for the old policy's
logprobs), every step of one run takes the next variant of the learner's settings: the old
policy's logprobs must equal the loss's own logprobs of the same weights at that temperature
(the first iteration's ratio is 1), and the weights the loss receives must be the variant's
formula on the trainer's and the rollout's logprobs.

How the variants are switched: the test sets the learner's own settings (fields the loss never
reads) before each batch is produced; everything else is the real learner, trainer and engine.
"""

import numpy as np
import pytest

from sgl_jax_rollout_apps import demo
from tests.tunix_adapter.training_helpers import engine_config

pytestmark = pytest.mark.engine

TEMPERATURE = 0.7
VARIANTS = [
    {"use_rollout_logprobs": True},
    {"use_rollout_logprobs": False},
    *(
        {"use_rollout_logprobs": False, "is_correction": f"{level}-{mode}", "is_threshold": 1.5}
        for level in ("token", "sequence", "geometric")
        for mode in ("truncate", "mask")
    ),
    {"use_rollout_logprobs": True, "is_correction": "sequence-mask", "is_threshold": 1.5},
    {
        "use_rollout_logprobs": False,
        "is_correction": "token-mask",
        "is_threshold": 1.5,
        "is_rejection": "response_mask",
    },
    {"use_rollout_logprobs": True, "top_entropy_quantile": 0.2},
    {"use_rollout_logprobs": False, "is_correction": "token-truncate", "top_entropy_quantile": 0.5},
    {"use_rollout_logprobs": True, "advantage_estimator": "egpo", "top_entropy_quantile": 0.2},
]
DEFAULTS = {
    "is_correction": None,
    "is_rejection": "zero_weight",
    "is_threshold": 2.0,
    "top_entropy_quantile": None,
    "advantage_estimator": "grpo",
}


def loss_logprobs(cluster, example) -> np.ndarray:
    """The GRPO loss's own logprobs of the completion tokens under the actor's current
    weights, at the rollout temperature (tunix's `compute_per_token_logps`)."""
    from flax import nnx

    from sgl_jax_rollout import tunix_compat

    graphdef, state = nnx.split(cluster.actor_trainer.model)
    logps, _ = tunix_compat.per_token_logps_and_logits(
        graphdef,
        state,
        example.prompt_ids,
        example.completion_ids,
        cluster.rollout.pad_id(),
        cluster.rollout.eos_id(),
        TEMPERATURE,
    )
    return np.asarray(logps, np.float64)


def test_every_old_policy_path_and_correction_variant_in_grpo_steps(tiny_dir):
    from tunix_adapter.learners import RolloutGRPOConfig
    from tunix_adapter.off_policy import apply_correction

    config = engine_config(
        tiny_dir,
        algo="grpo",
        steps=2 * len(VARIANTS),  # num_iterations=2: two optimizer steps per batch
        prompts_per_step=2,
        temperature=TEMPERATURE,
        num_iterations=2,
    )
    checked = []
    cluster, learner = demo.build(config)
    produce = learner._generate_and_compute_advantage

    def with_variant(training_input, mode):
        settings = {**DEFAULTS, **VARIANTS[len(checked)]}
        # validated as a config of its own, then set on the learner's (the loss reads none)
        RolloutGRPOConfig(num_generations=config.num_generations, **settings)
        for name, value in settings.items():
            setattr(learner.algo_config, name, value)
        example = produce(training_input, mode)
        ids = np.asarray(example.completion_ids)
        mask = ids != cluster.rollout.pad_id()  # the completion tokens
        loss_mask = np.asarray(example.completion_mask, bool)
        current = loss_logprobs(cluster, example)
        old = np.asarray(example.old_per_token_logps, np.float64)
        rollout = np.asarray(example.rollout_logprobs, np.float64)
        weights = example.sampler_is_weights
        checked.append(
            {
                "settings": settings,
                "old_vs_loss": float(np.abs(old - current)[mask].max()),
                "rollout_vs_loss": float(np.abs(rollout - current)[mask].max()),
                "mask": mask,
                "loss_mask": loss_mask,
                "current": current,
                "rollout": rollout,
                "entropy": np.asarray(example.rollout_entropy, np.float64),
                "weights": None if weights is None else np.asarray(weights),
            }
        )
        return example

    learner._generate_and_compute_advantage = with_variant
    history = demo.train(config, cluster, learner)

    assert len(checked) == len(history) == len(VARIANTS)
    for step in checked:
        settings, mask = step["settings"], step["mask"]
        # the first iteration's ratio is 1 on every path, at T = 0.7 (with num_iterations=2,
        # tunix 0.1.7 asks the cluster for the old policy: unanswered, it would be the
        # engine's scores at temperature 1, off by nats)
        assert step["old_vs_loss"] < 1e-4, settings
        assert step["rollout_vs_loss"] < 1e-4, settings
        weights = step["weights"]
        if settings["is_correction"] is None and settings["top_entropy_quantile"] is None:
            assert weights is None, settings
            continue
        assert weights.shape == mask.shape and np.all(weights[~mask] == 0), settings
        want, want_mask = mask.astype(np.float64), mask
        if settings["is_correction"] is not None:
            cfg = RolloutGRPOConfig(num_generations=config.num_generations, **settings)
            want_mask, want = apply_correction(
                step["current"],
                step["rollout"],
                mask,
                cfg.off_policy_correction(),
                ratio_in_loss=settings["use_rollout_logprobs"],
            )
        if settings["top_entropy_quantile"] is not None:
            entropy = step["entropy"][mask]
            threshold = np.quantile(entropy, 1 - settings["top_entropy_quantile"])
            want = np.where(mask & (step["entropy"] >= threshold), want, 0.0)
            kept = np.mean(weights[mask] > 0)
            assert abs(kept - settings["top_entropy_quantile"]) < 0.1, (kept, settings)
        # same weights and policy: the ratios are 1 within float32 noise, so every variant keeps
        # (almost) every token at weight ~1, and in the loss's mask
        np.testing.assert_allclose(weights, want, atol=1e-3, err_msg=str(settings))
        np.testing.assert_array_equal(step["loss_mask"], want_mask, err_msg=str(settings))
    by_step = {i: row for i, row in enumerate(history)}
    corrected = [i for i, v in enumerate(VARIANTS) if "is_correction" in v]
    assert all(by_step[i]["is_weight_mean"] == pytest.approx(1.0, abs=1e-3) for i in corrected)
    # every metric the learner logs reaches the history, under its own name
    assert all(
        by_step[i]["off_policy/weight_mean"] == by_step[i]["is_weight_mean"] for i in corrected
    )
    truncated = [
        i for i, v in enumerate(VARIANTS) if v.get("is_correction", "").endswith("truncate")
    ]
    assert all("rollout_corr/rollout_is_max" in by_step[i] for i in truncated)
    forked = [i for i, v in enumerate(VARIANTS) if "top_entropy_quantile" in v]
    assert all(0 < by_step[i]["forking_kept_frac"] < 0.6 for i in forked)
    assert all("zero_variance_group_frac" in row for row in history)


def test_sweep_runs_grpo_forking_and_egpo_and_plots_them(tiny_dir, tmp_path):
    from sgl_jax_rollout_apps import sweep

    base = engine_config(
        tiny_dir,
        steps=2,
        prompts_per_step=2,
        out=str(tmp_path),
    )
    runs = sweep.run_sweep(base, seeds=[0], rho=0.2)
    assert list(runs) == ["grpo", "grpo forking (rho=0.2)", "egpo"]
    assert all(len(h) == 1 and len(h[0]) == 2 for h in runs.values())
    assert (tmp_path / "sweep.png").is_file()
    lines = (tmp_path / "sweep.jsonl").read_text().splitlines()
    assert len(lines) == 6
    assert all(0 < row["forking_kept_frac"] < 0.4 for row in runs["grpo forking (rho=0.2)"][0])
    assert set(sweep.summary(runs)) == set(runs)
    # same seed: same prompts, same initial weights, same seeded samples at the first step
    first = {name: h[0][0]["reward_mean"] for name, h in runs.items()}
    assert len(set(first.values())) == 1, first
