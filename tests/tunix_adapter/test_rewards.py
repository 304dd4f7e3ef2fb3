"""The strict binary function-calling reward: format and correctness are both required."""

import json

import pytest

from tunix_adapter.rewards import function_call_reward, parse_function_call

EXPECTED = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}


def call(body) -> str:
    return f"<tool_call>{body if isinstance(body, str) else json.dumps(body)}</tool_call>"


@pytest.mark.parametrize(
    "completion",
    [
        call(EXPECTED),
        "  " + call({"arguments": {"unit": "C", "city": "Paris"}, "name": "get_weather"}) + "\n",
        "<think>the user wants weather</think>\n" + call(EXPECTED),
    ],
)
def test_valid_correct_calls_get_one(completion):
    assert function_call_reward([None], [completion], [EXPECTED]) == [1.0]


@pytest.mark.parametrize(
    "completion",
    [
        json.dumps(EXPECTED),  # no tags
        call(EXPECTED)[:-1],  # unclosed tag
        call("{'name': 'get_weather'}"),  # not JSON
        call([EXPECTED]),  # not an object
        call({"name": "get_weather"}),  # arguments missing
        call({**EXPECTED, "extra": 1}),  # unknown key
        call({"name": 3, "arguments": {}}),  # name not a string
        "Sure! " + call(EXPECTED),  # text outside the call
        call(EXPECTED) + call(EXPECTED),  # two calls
        "<think>unclosed " + call(EXPECTED),
    ],
)
def test_malformed_calls_get_zero(completion):
    assert parse_function_call(completion) is None
    assert function_call_reward([None], [completion], [EXPECTED]) == [0.0]


@pytest.mark.parametrize(
    "wrong",
    [
        {"name": "get_time", "arguments": EXPECTED["arguments"]},
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "F"}},
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C", "days": 1}},
    ],
)
def test_well_formed_but_wrong_calls_get_zero(wrong):
    assert parse_function_call(call(wrong)) == wrong
    assert function_call_reward([None], [call(wrong)], [EXPECTED]) == [0.0]


def test_expected_calls_may_be_json_strings_and_must_match_in_number():
    assert function_call_reward([1, 2], [call(EXPECTED), "x"], [json.dumps(EXPECTED)] * 2) == [
        1.0,
        0.0,
    ]
    with pytest.raises(ValueError, match="expected_call"):
        function_call_reward([1, 2], [call(EXPECTED), "x"], [EXPECTED])
