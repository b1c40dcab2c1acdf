from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from gateway.http.protocol import REQUESTS, describe, note_unknown_fields

CHAT, COMPLETIONS = REQUESTS["chat"], REQUESTS["completions"]


def test_unknown_fields_are_kept_and_logged_once(caplog):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "brand_new_param": 1}
    assert CHAT.validate_python(body)["brand_new_param"] == 1  # allowed, kept
    with caplog.at_level(logging.INFO, logger="gateway.http.protocol"):
        seen: set[str] = set()
        note_unknown_fields("chat", body, seen)
        note_unknown_fields("chat", body, seen)
    assert [r.message for r in caplog.records].count(
        "forwarding unrecognised chat field 'brand_new_param' to vLLM unchanged"
    ) == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"model": "m", "messages": [{"role": "user", "content": 5}]},
            "'messages.0.content': Input should be a valid string (got int '5')",
        ),
        (
            {"model": "m", "messages": [{"role": "user"}], "seed": 1.5},
            "'seed': Input should be a valid integer (got float '1.5')",
        ),
        ({"messages": [{"role": "user"}]}, "'model': Field required"),
        (  # the union branch that got deepest names the fault, not "content should be a string"
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}],
            },
            "'messages.0.content.0.text': Input should be a valid string (got int '7')",
        ),
    ],
)
def test_describe_names_the_parameter(body, expected):
    with pytest.raises(ValidationError) as err:
        CHAT.validate_python(body)
    assert describe(err.value)[0] == expected


def test_completion_prompts():
    for prompt in ("x", ["a", "b"], [1, 2], [[1], [2, 3]]):
        COMPLETIONS.validate_python({"model": "m", "prompt": prompt})
