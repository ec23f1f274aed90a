"""The answer route's body — written from docs/http.md#questions and
docs/protocol.md#questions-to-a-person, checked without a server: the answer is any JSON
value (null included) and required; the person is the API key's, never the body's."""

from __future__ import annotations

from typing import Any

import pytest

from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.questions import _answer


@pytest.mark.parametrize("value", ["acme-main", None, 3, 2.5, True, [1, "x"], {"nights": 3}])
def test_an_answer_is_any_json_value(value: Any) -> None:
    a = _answer({"answer": value, "generation": 2, "commandId": "c-1"})
    assert (a.answer, a.generation, a.commandId) == (value, 2, "c-1")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"answer": "x", "actor": "ceo"}, "forbidden_field"),
        ({"answer": "x", "answeredBy": "ceo"}, "forbidden_field"),
        ({"answer": "x", "tenantId": "globex"}, "forbidden_field"),
        ({"answer": "x", "sessionId": "s"}, "forbidden_field"),
        ({}, "invalid_command"),  # no answer at all is not the answer null
        ({"answer": "x", "generation": "2"}, "invalid_command"),
        ({"answer": "x", "generation": 0}, "invalid_command"),
        ({"answer": "x", "extra": 1}, "invalid_command"),
        ([], "invalid_command"),
    ],
)
def test_an_answer_body_is_refused_before_anything_is_sent(body: Any, code: str) -> None:
    with pytest.raises(ApiError) as e:
        _answer(body)
    assert (e.value.status, e.value.code) == (400, code)
