"""The approval routes' bodies and the gate's keys as the run view shows them — written from
docs/http.md#approvals, checked without a server: what a body may name (the person is the
API key's, never the body's), and each key's last decision and who made it, read from the
golden approvals log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sessionstream.apps.gateway.approvals import _decision
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.runtimes.sink.approvals import actions_of
from sessionstream.schemas.events import Event

GOLDEN = Path(__file__).parents[3] / "golden" / "approvals.jsonl"


def test_a_decision_names_the_digest_and_may_name_a_generation_and_a_command_id() -> None:
    d = _decision({"argsDigest": "sha256:a", "generation": 2, "commandId": "c-1"}, deny=False)
    assert (d.argsDigest, d.generation, d.commandId, d.reason) == ("sha256:a", 2, "c-1", None)
    # an action asked without arguments has no digest: null, said explicitly
    assert _decision({"argsDigest": None}, deny=False).argsDigest is None
    assert _decision({"argsDigest": "d", "reason": "no"}, deny=True).reason == "no"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"argsDigest": "d", "actor": "ceo"}, "forbidden_field"),
        ({"argsDigest": "d", "decidedBy": "ceo"}, "forbidden_field"),
        ({"argsDigest": "d", "tenantId": "globex"}, "forbidden_field"),
        ({"argsDigest": "d", "sessionId": "s"}, "forbidden_field"),
        ({}, "invalid_command"),  # the digest the person saw: required
        ({"argsDigest": 7}, "invalid_command"),
        ({"argsDigest": "d", "generation": "2"}, "invalid_command"),
        ({"argsDigest": "d", "generation": True}, "invalid_command"),
        ({"argsDigest": "d", "generation": 0}, "invalid_command"),
        ({"argsDigest": "d", "reason": "yes"}, "invalid_command"),  # an approve has none
        ({"argsDigest": "d", "extra": 1}, "invalid_command"),
        ({"argsDigest": "x" * 201}, "invalid_command"),
        ([], "invalid_command"),
    ],
)
def test_a_decision_body_is_refused_before_anything_is_sent(body: Any, code: str) -> None:
    with pytest.raises(ApiError) as e:
        _decision(body, deny=False)
    assert (e.value.status, e.value.code) == (400, code)


def test_a_deny_reason_is_bounded() -> None:
    with pytest.raises(ApiError) as e:
        _decision({"argsDigest": "d", "reason": "x" * 501}, deny=True)
    assert e.value.code == "invalid_command"


def test_the_run_view_shows_each_key_its_decision_and_who_decided() -> None:
    events = []
    for line in GOLDEN.read_text().splitlines():
        row = json.loads(line)
        if "event" in row:
            events.append(Event.model_validate(row["event"]))
    first = events[0].run_id
    views = {a.key: a for a in actions_of([e for e in events if e.run_id == first])}
    pay1, mail, pay2, pay3 = views["pay-1"], views["mail-1"], views["pay-2"], views["pay-3"]
    # asked, lost with the lease, asked again by generation 2, approved by a person, paid
    assert (pay1.decision, pay1.decided_by, pay1.generation, pay1.completed) == (
        "approved",
        "user:bo",
        2,
        True,
    )
    assert pay1.args_digest == "sha256:" + "a" * 64 and pay1.expires_at is not None
    # the gate approved the email by itself: nobody decided, nothing was pending
    assert (mail.decision, mail.decided_by, mail.expires_at) == ("approved", None, None)
    assert (pay2.decision, pay2.reason, pay2.detail, pay2.decided_by) == (
        "denied",
        "denied",
        "no tips from this account",
        "user:bo",
    )
    assert (pay3.decision, pay3.reason, pay3.decided_by) == ("denied", "approval_expired", None)
    assert list(views)[:2] == ["pay-1", "mail-1"]  # in the order first asked
    assert pay1.json()["decidedBy"] == "user:bo" and "argsDigest" in pay1.json()
