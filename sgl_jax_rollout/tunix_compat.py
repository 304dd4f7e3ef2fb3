"""Every tunix symbol the project uses, resolved in one place, for tunix 0.1.7 and tunix main.

`from sgl_jax_rollout.tunix_compat import GRPOLearner` resolves the name on first use (module
`__getattr__`), so the engine side, which needs only the rollout base classes and the weight
mappings, never loads tunix's trainer modules. `SYMBOLS` says where each release keeps each
name: the first place that imports wins (0.1.7 first, then tunix main c7d8950f, 2026-08-21).
`MEMBERS` lists the members, private ones included, that our subclasses override, call or read;
they are checked when their class resolves, so a tunix release that drops one fails on import
with its name, never in the middle of training. `check_all()` resolves everything (a test runs
it on the installed tunix; `make test-tunix-main` on tunix main).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import re
from types import ModuleType
from typing import Any

# name -> ((module, attribute), ...): the first that imports wins.
SYMBOLS: dict[str, tuple[tuple[str, str], ...]] = {
    # engine side: the rollout interface, tokenizer adapter, weight mappings
    "BaseRollout": (("tunix.rl.rollout.base_rollout", "BaseRollout"),),
    "RolloutOutput": (("tunix.rl.rollout.base_rollout", "RolloutOutput"),),
    "RolloutConfig": (
        ("tunix.rl.rollout.base_rollout", "RolloutConfig"),
        ("tunix.common.configs", "RolloutConfig"),
    ),
    "CacheConfig": (("tunix.rl.rollout.base_rollout", "CacheConfig"),),
    "TokenizerAdapter": (("tunix.generate.tokenizer_adapter", "TokenizerAdapter"),),
    "MappingConfig": (("tunix.generate.mappings", "MappingConfig"),),
    "build_flat_dict": (("tunix.generate.utils", "build_flat_dict"),),
    "transfer_state_with_mappings": (("tunix.generate.utils", "transfer_state_with_mappings"),),
    # trainer side: cluster, learners, scoring, registries
    "RLCluster": (("tunix.rl.rl_cluster", "RLCluster"), ("tunix.rl.rl_cluster", "RLEngine")),
    "ClusterConfig": (
        ("tunix.rl.rl_cluster", "ClusterConfig"),
        ("tunix.common.configs", "ClusterConfig"),
    ),
    "RLTrainingConfig": (
        ("tunix.rl.rl_cluster", "RLTrainingConfig"),
        ("tunix.common.configs", "RLTrainingConfig"),
    ),
    "Role": (("tunix.rl.rl_cluster", "Role"), ("tunix.common.configs", "Role")),
    "Mode": (("tunix.rl.rl_cluster", "Mode"), ("tunix.common.configs", "Mode")),
    "create_critic_model": (("tunix.rl.utils", "create_critic_model"),),
    "put_params_on_memory_kind": (("tunix.rl.utils", "put_params_on_memory_kind"),),
    "reshard_model_to_mesh": (("tunix.rl.reshard", "reshard_model_to_mesh"),),
    "GRPOConfig": (("tunix.rl.grpo.grpo_learner", "GRPOConfig"),),
    "GRPOLearner": (("tunix.rl.grpo.grpo_learner", "GRPOLearner"),),
    "TrainExample": (("tunix.rl.grpo.grpo_learner", "TrainExample"),),
    "PPOConfig": (("tunix.rl.ppo.ppo_learner", "PPOConfig"),),
    "PPOLearner": (("tunix.rl.ppo.ppo_learner", "PPOLearner"),),
    "get_advantage_estimator": (("tunix.rl.function_registry", "get_advantage_estimator"),),
    "register_advantage_estimator": (
        ("tunix.rl.function_registry", "register_advantage_estimator"),
    ),
    "compute_per_token_logps": (("tunix.rl.common", "compute_per_token_logps"),),
    "grpo_loss_fn": (("tunix.rl.algo_core", "grpo_loss_fn"),),
    "process_ids": (("tunix.rl.common", "process_ids"),),
    "selective_log_softmax": (("tunix.rl.common", "selective_log_softmax"),),
    "build_positions_from_mask": (("tunix.rl.common", "build_positions_from_mask"),),
    "make_causal_attn_mask": (("tunix.rl.common", "make_causal_attn_mask"),),
    "left_pad": (("tunix.rl.agentic.utils", "left_pad"),),
    "right_pad": (("tunix.rl.agentic.utils", "right_pad"),),
    "TrajectoryItem": (("tunix.rl.agentic.agents.agent_types", "TrajectoryItem"),),
    # the agentic learner (tunix_adapter/agentic.py)
    "AgenticGRPOConfig": (("tunix.rl.agentic.agentic_grpo_learner", "GRPOConfig"),),
    "AgenticGRPOLearner": (("tunix.rl.agentic.agentic_grpo_learner", "GRPOLearner"),),
    "TaskEnvironment": (("tunix.rl.agentic.environments.task_environment", "TaskEnvironment"),),
    "ToolEnvironment": (("tunix.rl.agentic.environments.tool_environment", "ToolEnvironment"),),
    "ToolAgent": (("tunix.rl.agentic.agents.tool_agent", "ToolAgent"),),
    "ModelAgent": (("tunix.rl.agentic.agents.model_agent", "ModelAgent"),),
    "CalculatorTool": (("tunix.rl.agentic.tools.calculator_tool", "CalculatorTool"),),
    "ToolCall": (("tunix.rl.agentic.tools.base_tool", "ToolCall"),),
    "get_tool_parser": (
        ("tunix.rl.agentic.parser.tool_parser.tool_parser_registry", "get_tool_parser"),
    ),
    "BaseTaskEnv": (("tunix.rl.agentic.environments.base_environment", "BaseTaskEnv"),),
    "EnvStepResult": (("tunix.rl.agentic.environments.base_environment", "EnvStepResult"),),
    "QwenChatTemplateParser": (
        ("tunix.rl.agentic.parser.chat_template_parser.parser", "QwenChatTemplateParser"),
    ),
    "TrajectoryCollectEngine": (
        ("tunix.rl.agentic.trajectory.trajectory_collect_engine", "TrajectoryCollectEngine"),
    ),
    "sanitize_control_tokens": (("tunix.utils.token_sanitization", "sanitize_control_tokens"),),
    "tokenize_and_generate_masks": (("tunix.rl.agentic.utils", "tokenize_and_generate_masks"),),
    "get_recent_assistant_user_messages": (
        ("tunix.rl.agentic.utils", "get_recent_assistant_user_messages"),
    ),
    # tunix main's distributed RL (tunix/experimental/, none in 0.1.7): tunix_sampler.py, remote
    "ExperimentalSampler": (("tunix.experimental.rollout.sampler", "Sampler"),),
    "SamplingRequest": (("tunix.experimental.rollout.sampler", "SamplingRequest"),),
    "TunixSamplingParams": (("tunix.experimental.rollout.sampler", "SamplingParams"),),
    "SamplingResponse": (("tunix.experimental.rollout.sampler", "SamplingResponse"),),
    "SamplerLoadInfo": (("tunix.experimental.rollout.sampler", "LoadInfo"),),
    "WeightSyncRequest": (("tunix.experimental.rollout.sampler", "WeightSyncRequest"),),
    "ErrorInfo": (("tunix.experimental.common.datatypes", "ErrorInfo"),),
    "RolloutRequest": (("tunix.experimental.common.datatypes", "RolloutRequest"),),
    "RolloutWorker": (("tunix.experimental.worker.rollout_worker", "RolloutWorker"),),
    "GrpcRemoteExecutionServer": (
        ("tunix.experimental.worker.remote_execution", "GrpcRemoteExecutionServer"),
    ),
    "RemoteActorHandle": (("tunix.experimental.worker.remote_execution", "ActorHandle"),),
    # the rollouts we compare with and benchmark against
    "VanillaRollout": (("tunix.rl.rollout.vanilla_rollout", "VanillaRollout"),),
    "TunixSglangJaxRollout": (("tunix.rl.rollout.sglang_jax_rollout", "SglangJaxRollout"),),
    "VllmRollout": (("tunix.rl.rollout.vllm_rollout", "VllmRollout"),),
}

# Modules imported for what they register or hold, not for a name: `algo_core` registers
# tunix's own "grpo" advantage estimator; `rl_utils` holds `_is_same_state`, which
# `tunix_adapter.upstream_fixes` replaces.
MODULES: dict[str, str] = {
    "algo_core": "tunix.rl.algo_core",
    "rl_utils": "tunix.rl.utils",
}

# class name -> members we override, call or read (found in the class, its bases, or, for
# attributes set in `__init__`, the source of the class or its bases).
MEMBERS: dict[str, tuple[str, ...]] = {
    "BaseRollout": (
        "generate",
        "get_per_token_logps",
        "update_params",
        "pad_id",
        "eos_id",
        "model",
    ),
    "RLCluster": (
        *("generate", "rollout", "actor_trainer", "get_actor_per_token_logps"),
        *("get_old_per_token_logps", "get_rollout_config", "buffer_metrics", "sync_weights"),
        *("update_actor", "cluster_config", "_anchor_policy_state"),
    ),
    "GRPOLearner": (
        *("_generate_and_compute_advantage", "_compute_rewards", "_prepare_data"),
        *("reward_manager", "_compute_logps_micro_batch_size", "should_sync_weights"),
        *("rl_cluster", "algo_config"),
    ),
    "TrainExample": (
        *("old_per_token_logps", "sampler_is_weights", "prompt_ids", "completion_ids"),
        "completion_mask",
    ),
    "VanillaRollout": ("generate", "_sampler"),
    "rl_utils": ("_is_same_state",),
    "AgenticGRPOLearner": (
        *("_model_call", "_rollout_sync_lock", "chat_parser", "tokenizer", "policy_version"),
        "should_sync_weights",
    ),
    "TaskEnvironment": ("_initial_observation", "task"),
    "ToolEnvironment": ("_initial_observation", "task"),
    "ToolAgent": ("update_from_model", "tool_parser"),
    "QwenChatTemplateParser": (
        *("_parse_message", "_parse_system", "_parse_assistant", "_tokens_to_sanitize"),
        "tokens",
    ),
    "TrajectoryCollectEngine": ("_one_step",),
    "SamplingRequest": ("prompt", "sampling_params", "request_id"),
    "WeightSyncRequest": ("policy_version", "extra_config"),
}
# tunix main's alone: `check_all` checks them only where `tunix.experimental` imports.
EXPERIMENTAL = frozenset(
    name for name, places in SYMBOLS.items() if places[0][0].startswith("tunix.experimental")
)

__all__ = sorted(
    [
        *SYMBOLS,
        *MODULES,
        "agentic_keeps_full_turn",
        "check_all",
        "has_experimental",
        "model_module",
        "per_token_logps_and_logits",
        "ppo_learner",
    ]
)
_RESOLVED: dict[str, Any] = {}


class TunixIncompatible(ImportError):
    """The installed tunix lacks a name or member this project uses (the message says which)."""


def __getattr__(name: str) -> Any:
    if name in _RESOLVED:
        return _RESOLVED[name]
    if name in SYMBOLS:
        value = _resolve(name)
    elif name in MODULES:
        value = importlib.import_module(MODULES[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _check_members(name, value)
    _RESOLVED[name] = value
    return value


def _resolve(name: str) -> Any:
    tried = []
    for module_name, attribute in SYMBOLS[name]:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if not (err.name and module_name.startswith(err.name)):
                raise  # the module exists but one of its own dependencies is missing
            tried.append(f"{module_name} (no such module)")
            continue
        if hasattr(module, attribute):
            return getattr(module, attribute)
        tried.append(f"{module_name}.{attribute}")
    raise TunixIncompatible(
        f"tunix {_version()} has no {name}: looked for {', '.join(tried)} "
        "(sgl_jax_rollout/tunix_compat.py lists where each tunix release keeps it)"
    )


def _check_members(name: str, value: Any) -> None:
    missing = [m for m in MEMBERS.get(name, ()) if not _has_member(value, m)]
    if missing:
        raise TunixIncompatible(
            f"tunix {_version()}: {name} has no {', '.join(missing)}, which "
            "sgl-jax-rollout overrides or reads (sgl_jax_rollout/tunix_compat.py, MEMBERS)"
        )


def _has_member(value: Any, member: str) -> bool:
    if hasattr(value, member):
        return True
    if isinstance(value, ModuleType) or not inspect.isclass(value):
        return False
    if member in getattr(value, "__dataclass_fields__", {}):
        return True
    # An attribute set in `__init__`: assigned in the source of the class or one of its bases.
    assigned = re.compile(rf"self\.{member}\s*(:[^=\n]*)?=[^=]")
    for cls in value.__mro__:
        try:
            if assigned.search(inspect.getsource(cls)):
                return True
        except (OSError, TypeError):
            continue
    return False


def model_module(package: str, kind: str) -> ModuleType:
    """tunix's `tunix.models.<package>.<kind>` (kind: `model`, `params`,
    `params_safetensors` or `mapping_sglang_jax`), with an error naming the family when this
    tunix lacks it."""
    module_name = f"tunix.models.{package}.{kind}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise TunixIncompatible(f"tunix {_version()} has no {module_name}") from err
        raise


def grpo_loss(model: Any, example: Any, algo_config: Any, pad_id: int, eos_id: int) -> Any:
    """The scalar of tunix's GRPO loss (`algo_core.grpo_loss_fn`) on `example`: 0.1.7 returns
    `(loss, aux)`; tunix main a `LossOutput` whose `primary_loss` is a `WeightedMetric`
    (`unreduced_sum` and `denominator`, reduced by its `compute()`)."""
    out = __getattr__("grpo_loss_fn")(model, example, algo_config, pad_id, eos_id)
    loss = out.primary_loss if hasattr(out, "primary_loss") else out[0]
    return loss.compute() if hasattr(loss, "compute") else loss


def per_token_logps_and_logits(
    graphdef: Any,
    state: Any,
    prompt_tokens: Any,
    completion_tokens: Any,
    pad_id: int,
    eos_id: int,
    temperature: float,
    logits: bool = True,
) -> tuple[Any, Any]:
    """tunix's trainer-side logprobs `[B, L]` of the completions at `temperature`, and the
    trainer's logits at those positions divided by `temperature` `[B, L, V]` (None where
    `logits` is False).

    tunix 0.1.7 returns both from `compute_per_token_logps(return_logits=True)`, one program
    whichever is asked for (a second, without the logits, would compile again for nothing);
    tunix main dropped `return_logits` (it returns an entropy instead), so there the logits come
    from a second run of the forward tunix runs (`process_ids`, then the model on the prompt and
    completion), compiled as tunix compiles its own, and only where asked for."""
    compute = __getattr__("compute_per_token_logps")
    args = (graphdef, state, prompt_tokens, completion_tokens)
    kwargs = dict(pad_id=pad_id, eos_id=eos_id, temperature=temperature)
    if "return_logits" in inspect.signature(compute).parameters:
        both = compute(*args, return_logits=True, **kwargs)
        return both if logits else (both[0], None)
    logps = compute(*args, **kwargs)
    if not logits:
        return logps, None
    tokens, positions, mask, _ = __getattr__("process_ids")(
        prompt_tokens, completion_tokens, pad_id, eos_id
    )
    width = completion_tokens.shape[1]
    return logps, _completion_logits_program()(
        graphdef, state, tokens, positions, mask, width=width, temperature=temperature
    )


@functools.cache
def _completion_logits_program() -> Any:
    """`_completion_logits`, compiled as tunix compiles `compute_per_token_logps` (jax is
    imported on first use, as tunix is)."""
    import jax

    return jax.jit(_completion_logits, static_argnames=("width", "temperature"))


def _completion_logits(
    graphdef: Any,
    state: Any,
    tokens: Any,
    positions: Any,
    mask: Any,
    width: int,
    temperature: float,
) -> Any:
    """The model's logits at the `width` positions that predict the completion, divided by
    `temperature` (tunix main's `compute_per_token_logps` forward, as it runs it)."""
    from flax import nnx

    logits, _ = nnx.merge(graphdef, state)(
        tokens, positions=positions, attention_mask=mask, cache=None
    )
    return logits[:, -width - 1 : -1, :] / temperature


def ppo_learner(rl_cluster: Any, config: Any, **kwargs: Any) -> Any:
    """tunix's `PPOLearner` on `rl_cluster` with `config` (a `PPOConfig`): 0.1.7 names it
    `ppo_config`, tunix main `algo_config`."""
    learner = __getattr__("PPOLearner")
    parameters = inspect.signature(learner.__init__).parameters
    name = "ppo_config" if "ppo_config" in parameters else "algo_config"
    return learner(rl_cluster=rl_cluster, **{name: config}, **kwargs)


def agentic_keeps_full_turn() -> bool:
    """Whether tunix's agentic learner records a turn whose completion fills the episode's
    response budget. tunix 0.1.7 returns from `TrajectoryCollectEngine._one_step` before the
    agent records it (`trajectory_collect_engine.py:535-537`: no tokens, no logprobs, the reward
    scored on ""); tunix main skips only the environment step then (`if not
    self._check_and_set_context_limit_reached():` around `env.step`)."""
    engine = __getattr__("TrajectoryCollectEngine")
    source = inspect.getsource(engine._one_step)
    return "if not self._check_and_set_context_limit_reached()" in source


class _DropsUnmappedWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("!!! No mapping for flat states")


def transfer_state_checked(**kwargs: Any) -> Any:
    """tunix's `transfer_state_with_mappings(**kwargs)` for a caller that checks coverage
    itself (`engine/weights.py` raises on a parameter left unwritten): tunix's warning "!!! No
    mapping for flat states", listing every target its table leaves alone (`generate/utils.py`,
    0.1.7 line 429: the LoRA buffers in a base pass, the base weights in an adapter pass;
    hundreds of names at every engine start), is dropped while it runs."""
    absl = logging.getLogger("absl")
    dropping = _DropsUnmappedWarning()
    absl.addFilter(dropping)
    try:
        return __getattr__("transfer_state_with_mappings")(**kwargs)
    finally:
        absl.removeFilter(dropping)


def check_all(names: tuple[str, ...] | None = None) -> None:
    """Resolves every name (or `names`) and checks its members; raises `TunixIncompatible`
    naming the first that fails. `VllmRollout` needs vLLM and is checked only where it imports;
    tunix main's `EXPERIMENTAL` names only where `tunix.experimental` does."""
    for name in names or (*SYMBOLS, *MODULES):
        if name == "VllmRollout" and importlib.util.find_spec("vllm") is None:
            continue
        if name in EXPERIMENTAL and not has_experimental():
            continue
        __getattr__(name)


def has_experimental() -> bool:
    """Whether the installed tunix has `tunix.experimental` (tunix main; 0.1.7 has none)."""
    return importlib.util.find_spec("tunix.experimental") is not None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("google-tunix")
    except PackageNotFoundError:
        return "(not installed)"
