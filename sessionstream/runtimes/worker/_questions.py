"""A handler's questions to a person (`ctx.ask_user`): what the run waits on, and the
answer's check against the type the handler declared."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from sessionstream.errors import SessionstreamError

__all__ = ["QuestionBook", "QuestionClosed", "check_answer", "schema_of"]

#: (status, answer's JSON text or None, reason): `answered` or `closed`
Outcome = tuple[str, str | None, str | None]


class QuestionClosed(SessionstreamError):
    """The question got no answer the handler can use: its window closed
    (`question_expired`), the run asked too many (`too_many_questions`), the run is
    compacting, or the answer does not fit the declared schema (`invalid_answer: ...`)."""

    def __init__(self, question_id: str, reason: str | None) -> None:
        super().__init__(f"question {question_id!r} closed: {reason}")
        self.question_id = question_id
        self.reason = reason


class QuestionBook:
    """The questions a holder waits on, by question id; resolved by the run's events."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[Outcome]] = {}
        #: question.ask command id -> its question id (to match a rejection)
        self.commands: dict[str, str] = {}

    def wait(self, question_id: str) -> tuple[asyncio.Future[Outcome], bool]:
        """The future of `question_id` and whether it is new (then the caller asks)."""
        fut = self.waiting.get(question_id)
        if fut is not None and not fut.done():
            return fut, False
        fut = asyncio.get_running_loop().create_future()
        self.waiting[question_id] = fut
        return fut, True

    def resolve(self, question_id: str, outcome: Outcome) -> None:
        fut = self.waiting.get(question_id)
        if fut is not None and not fut.done():
            fut.set_result(outcome)

    def close_all(self, reason: str) -> None:
        """Every question still waited on ends (a cancel, a fence, the run's end)."""
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_result(("closed", None, reason))


def schema_of(schema: Any) -> tuple[Any, TypeAdapter[Any] | None]:
    """(the JSON value sent as `schema`, the validator) of what `ask_user` was given: a
    Python type (its JSON schema is sent, answers are validated by pydantic), a JSON schema
    dict (sent as is; `type` and `enum` checked), or None (anything)."""
    if schema is None:
        return None, None
    if isinstance(schema, dict):
        return schema, None
    adapter: TypeAdapter[Any] = TypeAdapter(schema)
    return adapter.json_schema(), adapter


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def check_answer(
    question_id: str, answer_json: str, schema: Any, adapter: TypeAdapter[Any] | None
) -> Any:
    """The answer, parsed (and, with a Python type, converted); QuestionClosed
    `invalid_answer` if it does not fit."""
    value = json.loads(answer_json)
    if adapter is not None:
        try:
            return adapter.validate_python(value)
        except ValidationError as e:
            raise QuestionClosed(question_id, f"invalid_answer: {e.errors()[0]['msg']}") from e
    if isinstance(schema, dict):
        if "enum" in schema and value not in schema["enum"]:
            raise QuestionClosed(question_id, f"invalid_answer: {value!r} is not one of the enum")
        want = _JSON_TYPES.get(str(schema.get("type")))
        bad_bool = isinstance(value, bool) and schema.get("type") in ("integer", "number")
        if want is not None and (not isinstance(value, want) or bad_bool):
            raise QuestionClosed(question_id, f"invalid_answer: not a {schema['type']}")
    return value
