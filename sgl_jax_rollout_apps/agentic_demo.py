"""`demo --learner agentic`: tunix's agentic GRPO learner (`AgenticGRPOLearner`) on the demo's
tasks, with either rollout.

Owns what an agentic run adds to a demo run: its learner (`learner`), the sizes of its episodes
and engine (`episode_tokens`, `first_prompt_tokens`, `turn_prompt_tokens`, `context_tokens`,
`prompt_tokens`, `engine_settings`), its per-step metrics
(`episode_metrics`) and, with a tool, the held-out evaluation of whole episodes
(`tool_accuracy`).

- Single-turn episodes: tunix's `ModelAgent` and our `ScalarTaskEnvironment`, the step's
  prompts as the user message (the toy task's, or the task's question under its system
  message); the reward is the run's reward function, as in the default learner's run.
- `tools="calculator"` (the arithmetic task): tunix's `ToolAgent` with its `CalculatorTool`
  (the tool's JSON schema in the system message, calls parsed by tunix's Qwen tool parser;
  the chat rendered by `ToolPromptChatParser`, which keeps the tool-call example's tags),
  our `ScalarToolEnvironment` running the calls; an episode has at most `TOOL_STEPS` turns
  and its reward is the environment's: 1.0 when the final answer's last integer is the sum.
  Each step logs `tools/call_frac`, the share of episodes whose first turn calls the tool.

Either rollout gets its calls through `tunix_adapter.agentic.AgenticModelCall`, each call
with its own seed (tunix's own call would give every member of a GRPO group the same seed):
ours token in, token out; tunix's vanilla rollout with the chat rendered as text, as tunix
calls it (it takes no token ids).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# An episode with the calculator: a call, then the answer (a third turn if the model calls
# again); what a tool's output adds to the episode between two turns, at most.
TOOL_STEPS = 3
TOOL_OUTPUT_TOKENS = 32
# A single-turn episode's prompt (the built-in model's tokenizer spends a token on every few
# characters); a tool episode's first prompt is measured (`first_prompt_tokens`).
FIRST_PROMPT_TOKENS = 128


def engine_settings(episode_context: int) -> dict[str, Any]:
    """The engine's settings for episodes of up to `episode_context` tokens (`context_tokens`).
    tunix's orchestrator sends one chat a call; the engine batches the calls of
    `max_concurrency` episodes (16 by default). Sized for CPU; the context holds a whole
    episode, so its last turn's prompt with what is left of the budget."""
    return dict(
        max_running_requests=32,
        precompile_bs_paddings=(4, 16, 32),
        precompile_token_paddings=(512, 2048),
        max_prefill_tokens=2048,
        context_length=max(1024, _round_up(episode_context, 256)),
        max_total_tokens=16384,
    )


def episode_tokens(config: Any) -> int:
    """tunix's `max_response_length`: what an episode may add after its first prompt (the
    model's turns and, with tools, the tools' outputs between them)."""
    if config.tools is None:
        return config.max_tokens
    return TOOL_STEPS * config.max_tokens + (TOOL_STEPS - 1) * TOOL_OUTPUT_TOKENS


def first_prompt_tokens(config: Any, tokenizer: Any) -> int:
    """An episode's first prompt, at most: a system message (tunix's default Qwen one where
    the task has none) and the question. A tool episode's holds the calculator's JSON schema:
    it is measured, the widest question's rendered as training renders it and encoded by
    `tokenizer` (the model's Hugging Face tokenizer), plus a few tokens for a question that
    encodes longer, rounded up to 64 (SmolLM2-135M-Instruct: 367 tokens; the built-in
    model's tokenizer, a token every 1.4 characters: 1,112)."""
    if config.tools is None:
        return FIRST_PROMPT_TOKENS
    from sgl_jax_rollout_apps.tasks import task
    from tunix_adapter.agentic import ToolPromptChatParser

    widest = task(config.task).operand_range[1]
    agent, _ = tool_episode(f"{widest} + {widest} =", str(2 * widest))
    first = ToolPromptChatParser(tokenizer).parse(
        agent.chat_completions, add_generation_prompt=True, is_first_msg=True
    )
    return _round_up(len(tokenizer(first)["input_ids"]) + 8, 64)


def turn_prompt_tokens(config: Any, first: int) -> int:
    """A turn's prompt, at most: the first prompt (`first`, from `first_prompt_tokens`) and,
    with tools, every turn but the last with the tools' outputs between them (the held-out
    evaluation, and tunix's text path, render each turn's prompt whole)."""
    return first + episode_tokens(config) - config.max_tokens


def context_tokens(config: Any, first: int) -> int:
    """An episode, at most: its first prompt (`first`) and tunix's `max_response_length`."""
    return first + episode_tokens(config)


def prompt_tokens(config: Any, first: int, token_in: bool) -> int:
    """The rollout's `max_prompt_length` (`first`: the first prompt's budget), to which
    tunix's agentic learner also left-pads every episode's first prompt when it trains
    (`agentic_grpo_learner.py:385-392` at 0.1.7: a row is this plus `max_response_length`).
    Token in (our rollout, `AgenticModelCall`), a later turn goes to the engine as ids and is
    never cut, so the first prompt is enough; on the text path (tunix's vanilla rollout) every
    turn's prompt meets it (`turn_prompt_tokens`)."""
    return first if token_in else turn_prompt_tokens(config, first)


def _round_up(tokens: int, multiple: int) -> int:
    return -(-tokens // multiple) * multiple


def tool_episode(question: str, answer: str) -> tuple[Any, Any]:
    """A calculator episode on `question`, reset: (tunix's `ToolAgent` under the arithmetic
    task's system message, holding the first prompt's chat; `ScalarToolEnvironment`)."""
    from sgl_jax_rollout import tunix_compat as tc
    from sgl_jax_rollout_apps.tasks import task
    from tunix_adapter.agentic import ScalarToolEnvironment

    tools = _tools()
    agent = tc.ToolAgent(system_prompt=task("arithmetic").system, tool_map=tools)
    env = ScalarToolEnvironment(
        {"prompts": question, "answer": answer},
        tool_map=tools,
        reward_fn=_answer_reward,
        max_steps=TOOL_STEPS,
    )
    observation, info = env.reset()
    agent.update_from_env(observation=observation, reward=0.0, done=False, info=info)
    return agent, env


def _tools() -> dict[str, Any]:
    """The tool map of `tools="calculator"` episodes (tunix's `ToolAgent` / `ToolEnvironment`)."""
    from sgl_jax_rollout import tunix_compat

    return {"calculator": tunix_compat.CalculatorTool}


def _answer_reward(task: dict[str, Any], action: str) -> float:
    """A tool episode's reward (`ToolEnvironment`'s `reward_fn`): 1.0 when the final answer's
    last integer is the task's answer."""
    from sgl_jax_rollout_apps.tasks import is_correct

    return float(is_correct(action, str(task["answer"])))


def learner(config: Any, cluster: Any, reward: Any) -> Any:
    """tunix's `AgenticGRPOLearner` on `cluster`, its model call ours (`serve_agentic`)."""
    from sgl_jax_rollout import tunix_compat as tc
    from sgl_jax_rollout_apps.tasks import task
    from tunix_adapter.agentic import (
        ScalarTaskEnvironment,
        ScalarToolEnvironment,
        ToolPromptChatParser,
        serve_agentic,
    )

    system = task(config.task).system if config.task else ""
    if config.tools:
        tools = _tools()
        episodes: dict[str, Any] = dict(
            agent_class=tc.ToolAgent,
            agent_kwargs={"tool_map": tools},
            env_class=ScalarToolEnvironment,
            env_kwargs={"tool_map": tools, "reward_fn": _answer_reward, "max_steps": TOOL_STEPS},
            reward_fns=None,  # the environment's reward (tunix adds it to reward_fns')
        )
    else:
        episodes = dict(env_class=ScalarTaskEnvironment, reward_fns=[reward])
    built = tc.AgenticGRPOLearner(
        cluster,  # `rl_cluster` under 0.1.7, `rl_engine` under tunix main
        algo_config=tc.AgenticGRPOConfig(
            system_prompt=system,
            num_generations=config.num_generations,
            num_iterations=config.num_iterations,
            max_response_length=episode_tokens(config),
            max_concurrency=config.max_concurrency,
            beta=0.0,
            off_policy_steps=config.off_policy_steps,
        ),
        chat_parser=ToolPromptChatParser(hf_tokenizer(cluster)),  # tunix's, tool tags kept
        metric_fns=[episode_metrics(bool(config.tools))],
        **episodes,
    )
    serve_agentic(
        built, cluster, token_in=config.rollout == "sglang_jax", turn_tokens=config.max_tokens
    )
    return built


def hf_tokenizer(cluster: Any) -> Any:
    """The Hugging Face tokenizer under the cluster's (tunix's adapter, and ours that picks a
    safe pad id, wrap it)."""
    from sgl_jax_rollout.tunix_compat import TokenizerAdapter

    tokenizer = cluster.tokenizer
    while isinstance(tokenizer, TokenizerAdapter):
        tokenizer = tokenizer.tokenizer
    return tokenizer


def _calls_tool(parser: Any, text: str) -> bool:
    try:
        return bool(parser.parse(text))
    except Exception:  # tunix's parser raises on malformed calls; ToolAgent reads none then
        return False


def episode_metrics(tools: bool):
    """A metric function for tunix's agentic learner: each step's reward mean under the name
    the demo reports (`rewards/score/mean`), and with tools `tools/call_frac`."""
    from sgl_jax_rollout import tunix_compat

    parser = tunix_compat.get_tool_parser("qwen")() if tools else None

    def agentic_metrics(prompts, completions, rewards, advantages, **_: Any) -> dict[str, Any]:
        metrics = {"rewards/score/mean": (float(np.mean(rewards)), np.mean)}
        if parser is not None:  # `completions`: each episode's first turn (tunix's choice)
            calls = [_calls_tool(parser, text) for text in completions]
            metrics["tools/call_frac"] = (float(np.mean(calls)), np.mean)
        return metrics

    return agentic_metrics


def tool_accuracy(
    rollout: Any,
    tokenizer: Any,
    questions: list[str],
    answers: list[str],
    config: Any,
    turn_tokens: int,
    rows_per_call: int,
) -> dict[str, float]:
    """Greedy tool episodes on held-out questions, as training runs them (tunix's `ToolAgent`
    and calculator, `ScalarToolEnvironment`, at most `TOOL_STEPS` turns of `turn_tokens`), each
    turn's prompt the chat rendered as text: {"accuracy": share of episodes whose final answer
    is right, "tool_call_share": share that called the tool}."""
    from tunix_adapter.agentic import ToolPromptChatParser

    parser = ToolPromptChatParser(tokenizer)
    greedy = dataclasses.replace(config, top_p=None, top_k=None, max_tokens_to_generate=turn_tokens)
    episodes = []
    for question, answer in zip(questions, answers, strict=True):
        agent, env = tool_episode(question, answer)
        episodes.append({"agent": agent, "env": env, "reward": 0.0, "called": False})
    running = list(episodes)
    while running:
        prompts = [
            parser.parse(e["agent"].chat_completions, add_generation_prompt=True, is_first_msg=True)
            for e in running
        ]
        texts: list[str] = []
        for start in range(0, len(prompts), rows_per_call):
            chunk = prompts[start : start + rows_per_call]
            texts += rollout.generate(chunk, greedy, temperature=0.0).text
        still = []
        for episode, text in zip(running, texts, strict=True):
            action = episode["agent"].update_from_model(text)
            episode["called"] |= any(c["function"]["name"] != "finish" for c in action.action)
            observation, reward, done, info = episode["env"].step(action)
            episode["reward"] += float(reward)
            if done:
                continue
            episode["agent"].update_from_env(observation, reward, done, info)
            still.append(episode)
        running = still
    return {
        "accuracy": float(np.mean([e["reward"] > 0 for e in episodes])),
        "tool_call_share": float(np.mean([e["called"] for e in episodes])),
    }
