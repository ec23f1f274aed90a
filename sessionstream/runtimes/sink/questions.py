"""Questions to a person as PostgreSQL shows them: each question of a run, open, answered
or closed, and the open questions of a tenant (what a person is asked to answer).

Read from the sink's projection (`agent_run_events`), a moment behind the log: a question
shown open may have been answered already. The answer itself is the processor's decision;
a late `question.answer` is rejected `question_not_open`, never applied twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from sessionstream.runtimes.sink.replay import events_of_active_runs
from sessionstream.schemas.events import Event
from sessionstream.schemas.questions import QuestionAnswered, QuestionAsked, QuestionClosed

__all__ = ["QUESTION_EVENT_TYPES", "QuestionView", "open_questions", "questions_of"]

#: the events that make or change a question's record (a `replayed` changes nothing)
QUESTION_EVENT_TYPES: Final = ("question.asked", "question.answered", "question.closed")


def _value(text: str | None) -> Any:
    """An answer or a schema travels as compact JSON text; the API shows the value."""
    return None if text is None else json.loads(text)


@dataclass
class QuestionView:
    """One question of a run: what was asked, and what became of it."""

    question_id: str
    question: str
    status: str  # open | answered | closed
    schema: str | None = None
    expires_at: int | None = None
    #: the generation whose holder asked it (last)
    generation: int | None = None
    answer: str | None = None
    answered_by: str | None = None
    answered_at: int | None = None
    #: why it closed unanswered (lease_lost, cancelling, run_finished, question_expired, ...)
    reason: str | None = None

    def json(self) -> dict[str, Any]:
        """The API's spelling (camelCase), the answer and schema as JSON values."""
        return {
            "questionId": self.question_id,
            "question": self.question,
            "status": self.status,
            "schema": _value(self.schema),
            "expiresAt": self.expires_at,
            "generation": self.generation,
            "answer": _value(self.answer),
            "answeredBy": self.answered_by,
            "answeredAt": self.answered_at,
            "reason": self.reason,
        }


def questions_of(events: Iterable[Event]) -> list[QuestionView]:
    """A run's questions from its events (in seq order), in the order first asked."""
    out: dict[str, QuestionView] = {}
    for e in events:
        if e.type == "question.asked":
            a = e.payload_as(QuestionAsked)
            view = out.setdefault(a.question_id, QuestionView(a.question_id, a.question, ""))
            view.question, view.schema, view.expires_at = a.question, a.schema_, a.expires_at
            view.status, view.reason, view.generation = "open", None, e.generation
        elif e.type == "question.answered":
            d = e.payload_as(QuestionAnswered)
            if d.question_id in out:
                view = out[d.question_id]
                view.status, view.answer = "answered", d.answer
                view.answered_by, view.answered_at = d.answered_by, e.ts
        elif e.type == "question.closed":
            c = e.payload_as(QuestionClosed)
            if c.question_id in out:
                out[c.question_id].status, out[c.question_id].reason = "closed", c.reason
    return list(out.values())


def open_questions(
    conn: psycopg.Connection[Any], tenant_id: str, limit: int = 200
) -> list[dict[str, Any]]:
    """The questions of `tenant_id`'s active runs that wait for a person's answer, the
    window closing soonest first: run, session (full id), and the question's view."""
    out: list[dict[str, Any]] = []
    for run_id, events in events_of_active_runs(conn, tenant_id, QUESTION_EVENT_TYPES).items():
        for view in questions_of(events):
            if view.status == "open":
                out.append({"runId": run_id, "sessionId": events[0].session_id, **view.json()})
    out.sort(key=lambda q: (q["expiresAt"] or 0, q["runId"], q["questionId"]))
    return out[:limit]
