"""Questions to a person (docs/protocol.md#questions-to-a-person): the holder's
`question.ask`, a person's `question.answer`, the events they give and the reasons an
answer is refused. Imported by `commands` and `events`, which list them with the rest."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from sessionstream.schemas._base import Payload
from sessionstream.schemas.inputs import JsonInput, is_absent

__all__ = [
    "MAX_QUESTION_CHARS",
    "QUESTION_EVENT_PAYLOADS",
    "QuestionAnswerPayload",
    "QuestionAnswered",
    "QuestionAskPayload",
    "QuestionAsked",
    "QuestionClosed",
    "QuestionEventType",
    "QuestionRejection",
    "QuestionReplayed",
]

#: longest question a worker may ask a person
MAX_QUESTION_CHARS: Final = 4096
#: the longest id on the wire and the largest integer (as in `commands`, which imports this)
_MAX_ID_CHARS: Final = 200
_MAX_WIRE_INT: Final = 2**53 - 1


class QuestionAskPayload(Payload):
    """The holder asks a person `question` and waits for the answer (`schema`: the JSON
    value the answer must fit, as the SDK declares it; null: any answer)."""

    question_id: str = Field(min_length=1, max_length=_MAX_ID_CHARS)
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    schema_: JsonInput = Field(default=None, alias="schema", exclude_if=is_absent)


class QuestionAnswerPayload(Payload):
    """A person answers an open question of the run the envelope names: any JSON value;
    `generation`, when given, the question's generation."""

    question_id: str = Field(min_length=1, max_length=_MAX_ID_CHARS)
    answer: JsonInput = None
    generation: int | None = Field(default=None, ge=1, le=_MAX_WIRE_INT)


class QuestionAsked(Payload):
    """The run waits for a person's answer until `expiresAt` (the decider's clock);
    `schema` is the JSON text of what the answer must fit (null: anything)."""

    question_id: str
    question: str
    schema_: str | None = Field(default=None, alias="schema")
    expires_at: int


class QuestionAnswered(Payload):
    """A person answered: `answer` is its compact JSON text, `answeredBy` the actor."""

    question_id: str
    answer: str
    answered_by: str | None = None


class QuestionClosed(Payload):
    """The question gets no answer from this wait (`lease_lost`: the next holder may ask
    it again)."""

    question_id: str
    reason: str


class QuestionReplayed(Payload):
    """The same question asked again: its record repeated (`answered`: the recorded
    answer, never a second one; `open`: still waiting; `closed`: why)."""

    question_id: str
    status: Literal["open", "answered", "closed"]
    answer: str | None = None
    answered_by: str | None = None
    reason: str | None = None


QuestionEventType = Literal[
    "question.asked", "question.answered", "question.closed", "question.replayed"
]

QUESTION_EVENT_PAYLOADS: Final[dict[str, type[Payload]]] = {
    "question.asked": QuestionAsked,
    "question.answered": QuestionAnswered,
    "question.closed": QuestionClosed,
    "question.replayed": QuestionReplayed,
}

#: the reasons a `question.answer` is refused
QuestionRejection = Literal[
    "unknown_question",
    "question_not_open",
    "question_stale",
    "question_expired",
    "answer_too_large",
]
