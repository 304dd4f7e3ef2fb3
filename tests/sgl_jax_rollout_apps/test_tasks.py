"""The real tasks of `demo --task` (sgl_jax_rollout_apps/tasks.py): problems, held-out split,
reward, and the two-proportion test (against scipy's chi-square test, which equals it)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sgl_jax_rollout_apps.tasks import TASKS, is_correct, task, two_proportion_p


def test_problems_are_seeded_and_held_out_questions_never_reach_training():
    arithmetic = task("arithmetic")
    held_out = arithmetic.held_out(200, seed=0)
    assert len({p.question for p in held_out}) == 200
    assert arithmetic.held_out(200, seed=0) == held_out
    train = arithmetic.problems(5000, seed=0, exclude=held_out)
    assert not {p.question for p in train} & {p.question for p in held_out}
    assert train == arithmetic.problems(5000, seed=0, exclude=held_out)
    for p in train[:50]:
        a, b = (int(x) for x in p.question.removesuffix(" =").split(" + "))
        assert 0 <= a <= 20 and 0 <= b <= 20 and p.answer == str(a + b)
    with pytest.raises(ValueError, match="at most half of the task's 441 questions"):
        arithmetic.held_out(221, seed=0)
    with pytest.raises(ValueError, match="task must be one of"):
        task("chess")


@pytest.mark.parametrize(
    ("completion", "right"),
    [
        ("7 + 9 = 16.", True),
        ("16", True),
        ("The answer is 16", True),
        ("The answer is 11.", False),
        ("16 is not it, 17", False),
        ("-16", False),
        ("", False),
        ("sixteen", False),
    ],
)
def test_the_reward_reads_the_last_integer(completion, right):
    assert is_correct(completion, "16") is right
    reward = TASKS["arithmetic"].reward_fn("chat")(["p"], [completion], answer=np.array(["16"]))
    assert reward == [float(right)]


@pytest.mark.parametrize(
    ("completion", "right"),
    [
        (" 16\n", True),
        (" 16", True),
        (" 16\n3 + 4 = 7\n", True),  # the model goes on with the next solved problem
        (" 15\n9 + 7 = 16", False),  # the right sum on a later line is not the answer
        (" 1 6\n", False),
        ("\n16", False),
        ("", False),
    ],
)
def test_a_few_shot_completion_is_read_to_its_first_newline(completion, right):
    assert is_correct(completion, "16", first_line=True) is right
    reward = TASKS["arithmetic"].reward_fn("few-shot")
    assert reward.__name__ == "reward"  # tunix logs rewards/<name>
    assert reward(["p"], [completion], answer=np.array(["16"])) == [float(right)]


def test_two_proportion_p_matches_scipy():
    from scipy.stats import chi2_contingency

    for before, after, n in [(0.2, 0.35, 200), (0.3, 0.3, 200), (0.1, 0.5, 50)]:
        table = [[before * n, (1 - before) * n], [after * n, (1 - after) * n]]
        expected = chi2_contingency(table, correction=False).pvalue
        assert two_proportion_p(before, after, n, n) == pytest.approx(expected, rel=1e-9)


def test_chat_prompts_use_the_system_message_and_the_template():
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tiny_model import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    arithmetic = task("arithmetic")
    problem = arithmetic.problems(1, seed=3)[0]
    prompt = arithmetic.prompt(tokenizer, problem)
    assert prompt.startswith("<|im_start|>system\nYou are a calculator.")
    assert prompt.endswith(
        f"<|im_start|>user\n{problem.question}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_few_shot_prompts_solve_fixed_problems_that_are_never_held_out():
    """The real Gemma 3 270M's tokenizer has no chat template: auto picks few-shot there and
    chat on the built-in model's; the prompt is the solved problems and the question, and
    generation stops at the tokenizer's newline tokens."""
    from transformers import AutoTokenizer

    from sgl_jax_rollout.tiny_model import default_model_dir
    from sgl_jax_rollout_apps.tasks import SHOTS, prompt_style, stop_ids

    arithmetic = task("arithmetic")
    shots = arithmetic.examples()
    assert len({p.question for p in shots}) == SHOTS and arithmetic.examples() == shots
    held_out = arithmetic.held_out(220, seed=0, exclude=shots)
    assert not {p.question for p in held_out} & {p.question for p in shots}
    chat = AutoTokenizer.from_pretrained(default_model_dir())
    assert prompt_style("auto", chat) == "chat" and stop_ids(chat, "chat") == []
    problem = held_out[0]
    prompt = arithmetic.prompt(chat, problem, "few-shot")
    lines = prompt.split("\n")
    assert lines[-1] == problem.question and len(lines) == SHOTS + 1
    for line, shot in zip(lines, shots, strict=False):
        a, b, c = (int(x) for x in line.replace("+", " ").replace("=", " ").split())
        assert line == f"{shot.question} {shot.answer}" and a + b == c
    newline = chat.encode("\n", add_special_tokens=False)
    assert len(newline) == 1 and newline[0] in stop_ids(chat, "few-shot")
    assert all(chat.decode([i]).strip("\n") == "" for i in stop_ids(chat, "few-shot"))
    no_template = SimpleNamespace(chat_template=None)
    assert prompt_style("auto", no_template) == "few-shot"
    with pytest.raises(ValueError, match="'chat' needs a tokenizer with a chat template"):
        prompt_style("chat", no_template)
    with pytest.raises(ValueError, match="prompt_style must be one of"):
        prompt_style("zero-shot", chat)


def test_evaluate_is_greedy_in_the_training_batchs_rows_and_shows_its_progress(capsys):
    """A test double for the rollout (this is about `evaluate`'s own loop): it records each
    call's rows and options and answers each prompt with its own index."""
    from sgl_jax_rollout.tunix_compat import RolloutConfig
    from sgl_jax_rollout_apps.tasks import evaluate

    calls = []

    def generate(prompts, config, **options):
        calls.append((len(prompts), config.top_p, config.top_k, options))
        return SimpleNamespace(text=[f"= {p}" for p in prompts])

    prompts = [str(i) for i in range(10)]
    answers = [str(i) if i % 4 else "x" for i in range(10)]  # 7 of 10 right
    config = RolloutConfig(max_tokens_to_generate=4, top_p=0.9, top_k=5)
    rollout = SimpleNamespace(generate=generate)
    assert evaluate(rollout, prompts, answers, config, 4, show_progress=True) == 0.7
    greedy = {"temperature": 0.0}
    assert calls == [(4, None, None, greedy)] * 2 + [(2, None, None, greedy)]
    shown = capsys.readouterr().err
    assert "held-out eval:" in shown and "/10 [" in shown, shown
    evaluate(rollout, prompts, answers, config, 4)
    assert capsys.readouterr().err == ""
    # a few-shot completion's answer ends at its first newline
    goes_on = SimpleNamespace(generate=lambda p, c, **_: SimpleNamespace(text=[" 5\n2 + 4 = 6"]))
    assert evaluate(goes_on, ["3 + 2 ="], ["6"], config, 4) == 1.0
    assert evaluate(goes_on, ["3 + 2 ="], ["6"], config, 4, style="few-shot") == 0.0
