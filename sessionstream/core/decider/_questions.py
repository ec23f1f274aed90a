"""Questions to a person: a holder asks, a person answers once, a wait ends explicitly."""

from __future__ import annotations

from sessionstream.core.decider._base import _LEASE_LOST, TOO_MANY_QUESTIONS
from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.state import QuestionRecord, RunState
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import (
    Command,
    json_text,
)
from sessionstream.schemas.questions import (
    QuestionAnswered,
    QuestionAnswerPayload,
    QuestionAsked,
    QuestionAskPayload,
    QuestionClosed,
    QuestionReplayed,
)


def _question_ask(em: _Emitter, cmd: Command, run: RunState) -> None:
    """`question.ask` by the current holder (fenced already)."""
    p = cmd.payload_as(QuestionAskPayload)
    qid = p.question_id
    first = run.questions.get(qid)
    schema = None if p.schema_ is None else json_text(p.schema_)
    if first is not None and first.status == "closed" and first.reason == _LEASE_LOST:
        # the next holder asks what its predecessor was waiting on when it lost the lease:
        # open again for this generation, within the same window
        if run.status != "running":
            _close(em, qid, run.status)
        elif em.now >= first.expires_at:
            _close(em, qid, "question_expired")
        else:
            _asked(em, qid, p.question, schema, first.expires_at)
    elif first is not None:
        em.on_run(
            "question.replayed",
            make(
                QuestionReplayed,
                question_id=qid,
                status=first.status,
                answer=first.answer,
                answered_by=first.answered_by,
                reason=first.reason,
            ),
        )
    elif len(run.questions) >= em.config.max_questions:
        _close(em, qid, TOO_MANY_QUESTIONS)
    elif run.status == "running":
        _asked(em, qid, p.question, schema, em.now + em.config.question_ttl_ms)
    else:
        _close(em, qid, run.status)


def _asked(em: _Emitter, qid: str, question: str, schema: str | None, expires_at: int) -> None:
    em.on_run(
        "question.asked",
        make(
            QuestionAsked, question_id=qid, question=question, schema_=schema, expires_at=expires_at
        ),
    )


def _close(em: _Emitter, qid: str, reason: str) -> None:
    em.on_run("question.closed", make(QuestionClosed, question_id=qid, reason=reason))


def close_open_questions(em: _Emitter, reason: str) -> None:
    """Every open question of the active run is closed with `reason`, in the order asked."""
    run = em.state.active
    assert run is not None
    for qid, _q in run.open_questions():
        _close(em, qid, reason)


def close_expired_questions(em: _Emitter, run: RunState) -> int:
    """The `approval_expiry` timer's part: every open question whose window has closed."""
    due = [qid for qid, q in run.open_questions() if q.expires_at <= em.now]
    for qid in due:
        _close(em, qid, "question_expired")
    return len(due)


def _question_answer(em: _Emitter, cmd: Command) -> None:
    """`question.answer`: a person answers an open question of the run the command names
    (checked active already)."""
    p = cmd.payload_as(QuestionAnswerPayload)
    run = em.state.active
    assert run is not None
    q = run.questions.get(p.question_id)
    answer = json_text(p.answer)
    size = len(answer.encode())
    if q is None:
        em.reject("unknown_question", f"run {run.run_id} never asked {p.question_id!r}")
    elif q.status != "open":
        em.reject("question_not_open", f"{p.question_id!r} is {_why(q)}")
    elif p.generation is not None and p.generation != q.generation:
        em.reject(
            "question_stale",
            f"the open question {p.question_id!r} is generation {q.generation}, not {p.generation}",
        )
    elif em.now >= q.expires_at:
        # the state is the timer's to change: it closes every expired question at once
        em.reject("question_expired", f"the question's window closed at {q.expires_at}")
    elif size > em.config.max_answer_bytes:
        em.reject(
            "answer_too_large",
            f"{size} bytes as JSON > {em.config.max_answer_bytes} (maxAnswerBytes)",
        )
    else:
        em.on_run(
            "question.answered",
            make(QuestionAnswered, question_id=p.question_id, answer=answer, answered_by=cmd.actor),
        )


def _why(q: QuestionRecord) -> str:
    if q.status == "answered":
        return f"answered by {q.answered_by}" if q.answered_by else "answered"
    return f"closed ({q.reason})"
