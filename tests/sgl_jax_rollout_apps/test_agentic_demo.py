"""`agentic_demo.tool_accuracy`: greedy tool episodes on held-out questions, scored on the final
answer, with the share that called the tool.

The rollout here is a scripted test double, and it says so: the test is about our episode loop
around tunix's `ToolAgent`, its calculator and Qwen tool parser and our `ScalarToolEnvironment`
(the chat each turn is asked, what the tool answered, when an episode ends and how it is
scored). The engine's tool episodes: tests/tunix_adapter/test_agentic_engine.py. And the
demo's prompt budgets: a tool episode's measured with the model's tokenizer, the rollout's
`max_prompt_length` token in and on tunix's text path."""

from __future__ import annotations

import re
import types

import pytest

pytestmark = pytest.mark.tunix


class ScriptedRollout:
    """Calls the calculator on "a + b =" for even a and repeats its result the turn after;
    for odd a answers "7" at once. Records every call's prompts."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def generate(self, prompts, config, temperature):
        assert temperature == 0.0 and config.top_p is None and config.max_tokens_to_generate == 48
        self.calls.append(list(prompts))
        texts = []
        for prompt in prompts:
            results = re.findall(r"<tool_response>\nTool returned result: (-?\d+)", prompt)
            a, b = (int(x) for x in re.findall(r"(\d+) \+ (\d+) =", prompt)[-1])
            if results:
                texts.append(f"The answer is {results[-1]}.")
            elif a % 2 == 0:
                call = {"name": "calculator", "arguments": {"a": a, "b": b, "op": "+"}}
                texts.append(f"<tool_call>\n{str(call).replace(chr(39), chr(34))}\n</tool_call>")
            else:
                texts.append("I think it is 7")
        return types.SimpleNamespace(text=texts)


def test_tool_episodes_are_scored_on_their_final_answer_and_count_the_tool_callers():
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tiny_model import default_model_dir
    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from sgl_jax_rollout_apps.agentic_demo import tool_accuracy
    from sgl_jax_rollout_apps.tasks import task

    problems = task("arithmetic").held_out(12, seed=0)
    rollout = ScriptedRollout()
    config = RolloutConfig(max_tokens_to_generate=200, max_prompt_length=512, top_p=1.0)
    scores = tool_accuracy(
        rollout,
        AutoTokenizer.from_pretrained(default_model_dir()),
        [p.question for p in problems],
        [p.answer for p in problems],
        config,
        turn_tokens=48,
        rows_per_call=5,
    )
    calling = [int(p.question.split()[0]) % 2 == 0 for p in problems]
    right = [c or p.answer == "7" for c, p in zip(calling, problems, strict=True)]
    assert 0 < sum(calling) < len(problems)
    assert scores == {
        "accuracy": pytest.approx(sum(right) / len(problems)),
        "tool_call_share": pytest.approx(sum(calling) / len(problems)),
    }
    # turn 1: every question, 5 a call; turn 2: the callers alone, the tool's result in the chat
    assert [len(c) for c in rollout.calls] == [5, 5, 2, *_chunks(sum(calling), 5)]
    assert all("<tools>" in prompt for prompt in rollout.calls[0])  # the calculator's schema


def _chunks(n: int, size: int) -> list[int]:
    return [min(size, n - start) for start in range(0, n, size)]


def test_a_tool_episodes_prompts_are_sized_by_the_models_tokenizer():
    # the calculator's schema is 1,112 tokens under the built-in model's tokenizer (367 under
    # SmolLM2's): a fixed budget cut every first prompt from the left, schema first. tunix pads
    # every trained row's first prompt to the rollout's max_prompt_length: token in, later
    # turns go as ids and are never cut, so it is the first prompt's; the text path cuts every
    # turn's prompt to it, so it holds the turns before the last
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tiny_model import default_model_dir
    from sgl_jax_rollout_apps import agentic_demo as demo
    from sgl_jax_rollout_apps.tasks import task
    from tunix_adapter.agentic import ToolPromptChatParser

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    config = types.SimpleNamespace(tools="calculator", task="arithmetic", max_tokens=48)
    first = demo.first_prompt_tokens(config, tokenizer)
    parser = ToolPromptChatParser(tokenizer)
    longest = 0
    for problem in task("arithmetic").held_out(50, seed=0):
        agent, _ = demo.tool_episode(problem.question, problem.answer)
        text = parser.parse(agent.chat_completions, add_generation_prompt=True, is_first_msg=True)
        longest = max(longest, len(tokenizer(text)["input_ids"]))
    assert 1_000 < longest <= first < longest + 128
    episode = demo.episode_tokens(config)  # 3 turns of 48, 2 tool outputs of 32
    assert demo.prompt_tokens(config, first, token_in=True) == first
    turn = demo.turn_prompt_tokens(config, first)
    assert demo.prompt_tokens(config, first, token_in=False) == turn == first + episode - 48
    context = demo.engine_settings(demo.context_tokens(config, first))["context_length"]
    assert context >= first + episode == turn + 48  # the last turn's prompt and its tokens
    single_turn = types.SimpleNamespace(tools=None, task="arithmetic", max_tokens=48)
    single_first = demo.first_prompt_tokens(single_turn, tokenizer)
    assert single_first == demo.FIRST_PROMPT_TOKENS
    for token_in in (True, False):
        assert demo.prompt_tokens(single_turn, single_first, token_in) == single_first


def test_the_cluster_tokenizer_is_unwrapped_to_the_models_own():
    # a cluster's tokenizer is tunix's adapter around ours (a safe pad id) around the model's;
    # the prompt budgets encode with the model's (the adapters are not callable)
    from transformers import AutoTokenizer

    from sgl_jax_rollout.pad_id import pad_safe
    from sgl_jax_rollout.tiny_model import default_model_dir
    from sgl_jax_rollout.tunix_compat import TokenizerAdapter
    from sgl_jax_rollout_apps import agentic_demo

    raw = AutoTokenizer.from_pretrained(default_model_dir())
    wrapped = TokenizerAdapter(pad_safe(raw, len(raw), []))
    unwrapped = agentic_demo.hf_tokenizer(types.SimpleNamespace(tokenizer=wrapped))
    assert unwrapped is raw
    config = types.SimpleNamespace(tools="calculator", task="arithmetic", max_tokens=48)
    assert agentic_demo.first_prompt_tokens(config, unwrapped) > 1_000


def test_a_batch_sampled_ahead_past_max_steps_is_not_reported_as_a_step(capsys):
    # tunix's agentic learner with off_policy_steps 1 and max_steps 2 samples a third batch,
    # trains none of it and flushes its rollout metrics. The cluster and the learner here are
    # test doubles that flush three such buffers: the test is about `demo.train`'s record.
    from sgl_jax_rollout.tunix_compat import Mode
    from sgl_jax_rollout_apps import demo
    from sgl_jax_rollout_apps.demo_config import DemoConfig

    config = DemoConfig(learner="agentic", off_policy_steps=1, steps=2, show_progress=False)
    cluster = types.SimpleNamespace(rollout=types.SimpleNamespace())
    cluster.with_external_metrics_logger = lambda fn: setattr(cluster, "logger", fn)

    class FlushingLearner:
        def train(self, batches):
            for reward in (0.25, 0.5, 0.75):
                cluster.logger(
                    types.SimpleNamespace(
                        mode=Mode.TRAIN, metrics={"rewards/score/mean": ([reward], None)}
                    )
                )

    history = demo.train(config, cluster, FlushingLearner())
    assert [row["reward_mean"] for row in history] == [0.25, 0.5]
    assert [row["step"] for row in history] == [0, 1]
    out = capsys.readouterr().out
    assert "off_policy_steps 1) was not trained: tunix stopped at max_steps 2" in out
