"""The questions of a run as the gateway's run view and `questions list` show them
(`sessionstream.runtimes.sink.questions`), built from a real decider log: what was asked,
whether it is open, answered (with what, by whom) or closed (why)."""

from __future__ import annotations

from sessionstream.runtimes.sink.questions import questions_of
from tests.unit._harness import Harness, leased


def test_open_answered_and_closed_questions_read_from_the_log() -> None:
    h = Harness()
    leased(h)
    h.ask("q1", "Which account?")
    h.ask("q2", "How many seats?")
    views = {q.question_id: q for q in questions_of(h.log)}
    assert [v.status for v in views.values()] == ["open", "open"]
    assert views["q1"].question == "Which account?" and views["q1"].expires_at is not None
    h.answer("q1", {"account": "acme-main"}, actor="user:bo")
    h.abort()  # the cancel closes what is still open, first
    views = {q.question_id: q for q in questions_of(h.log)}
    q1, q2 = views["q1"].json(), views["q2"].json()
    assert (q1["status"], q1["answer"], q1["answeredBy"]) == (
        "answered",
        {"account": "acme-main"},
        "user:bo",
    )
    assert q1["answeredAt"] is not None and q1["generation"] == 1
    assert (q2["status"], q2["answer"], q2["reason"]) == ("closed", None, "cancelling")


def test_a_question_asked_again_after_a_takeover_is_open_for_the_new_generation() -> None:
    h = Harness()
    leased(h)
    h.ask("q1")
    h.fire("lease_expiry")  # the holder is gone: the question closes lease_lost
    (closed,) = questions_of(h.log)
    assert (closed.status, closed.reason) == ("closed", "lease_lost")
    h.acquire("w2")
    h.ask("q1", worker="w2")
    (again,) = questions_of(h.log)
    assert (again.status, again.reason, again.generation) == ("open", None, 2)
