"""The audit's tenth point, "no action executed without its required approval", on the
golden approvals log and on crafted logs that break it (docs/protocol.md#approvals: a key
whose kind needs a person is approved only by a person, for the request they were shown)."""

from __future__ import annotations

import json
from pathlib import Path

from sessionstream.core.approvals import unapproved_actions
from sessionstream.schemas.events import Event

GOLDEN = Path(__file__).parents[2] / "golden" / "approvals.jsonl"
RUN = "run-1"


def _golden() -> list[Event]:
    out = []
    for line in GOLDEN.read_text().splitlines():
        row = json.loads(line)
        if "event" in row:
            out.append(Event.model_validate(row["event"]))
    return sorted(out, key=lambda e: (e.run_id, e.seq))


def _ev(seq: int, type_: str, payload: dict[str, object], tenant: str = "acme") -> Event:
    return Event.model_validate(
        {
            "sessionId": "s",
            "runId": RUN,
            "seq": seq,
            "type": type_,
            "payload": payload,
            "generation": 1,
            "commandId": f"c{seq}",
            "tenantId": tenant,
            "ts": 1_000 + seq,
        }
    )


def _started(kinds: list[str] | None = None) -> Event:
    return _ev(
        1,
        "run.started",
        {
            "prompt": "p",
            "origin": "prompt",
            "sourceCommandId": "c1",
            "timeoutAt": 10_000,
            "approvalKinds": kinds or [],
        },
    )


def _pending(seq: int, key: str = "pay-1") -> Event:
    return _ev(
        seq,
        "action.pending",
        {"idempotencyKey": key, "kind": "payment", "argsDigest": "sha256:a", "expiresAt": 9_000},
    )


def _approved(seq: int, by: str | None, key: str = "pay-1", kind: str = "payment") -> Event:
    return _ev(seq, "action.approved", {"idempotencyKey": key, "kind": kind, "decidedBy": by})


def _completed(seq: int, key: str = "pay-1") -> Event:
    return _ev(seq, "action.completed", {"idempotencyKey": key, "ok": True})


def test_the_golden_approvals_log_passes() -> None:
    # pay-1 was approved by user:bo after its pending request, then completed
    assert unapproved_actions(_golden(), ()) == []
    assert unapproved_actions(_golden(), (("*", "payment"),)) == []


def test_a_person_approving_the_pending_request_passes() -> None:
    log = [_started(), _pending(2), _approved(3, "user:bo"), _completed(4)]
    assert unapproved_actions(log, ()) == []


def test_a_pending_key_completed_after_the_gate_approved_it_fails() -> None:
    # crafted: the key waited for a person, yet the approval names nobody
    log = [_started(), _pending(2), _approved(3, None), _completed(4)]
    assert unapproved_actions(log, ()) == [f"{RUN}/pay-1#4"]


def test_a_completion_before_the_persons_approval_fails() -> None:
    log = [_started(), _pending(2), _completed(3), _approved(4, "user:bo")]
    assert unapproved_actions(log, ()) == [f"{RUN}/pay-1#3"]


def test_an_approval_by_a_person_for_no_pending_request_fails() -> None:
    # the settings say payments need a person: an approval that decided no pending request
    # (no digest was shown to anybody) is not the person's approval of these arguments
    log = [_started(), _approved(2, "user:bo"), _completed(3)]
    assert unapproved_actions(log, (("acme", "payment"),)) == [f"{RUN}/pay-1#3"]


def test_the_policy_and_the_runs_own_kinds_say_which_kinds_need_a_person() -> None:
    gate_only = [_approved(2, None), _completed(3)]
    # no policy, no run kinds: the gate's approval is enough
    assert unapproved_actions([_started(), *gate_only], ()) == []
    # the settings name payments for this tenant (or every tenant)
    assert unapproved_actions([_started(), *gate_only], (("acme", "payment"),)) != []
    assert unapproved_actions([_started(), *gate_only], (("*", "*"),)) != []
    # ... for another tenant only: not this run's
    assert unapproved_actions([_started(), *gate_only], (("globex", "payment"),)) == []
    # the prompt named the kind, or every kind
    assert unapproved_actions([_started(["payment"]), *gate_only], ()) != []
    assert unapproved_actions([_started(["*"]), *gate_only], ()) != []


def test_a_denied_key_asked_again_needs_the_persons_approval_of_the_new_request() -> None:
    lost = _ev(
        3,
        "action.denied",
        {"idempotencyKey": "pay-1", "kind": "payment", "reason": "lease_lost"},
    )
    ok = [_started(), _pending(2), lost, _pending(4), _approved(5, "user:bo"), _completed(6)]
    assert unapproved_actions(ok, ()) == []
    # crafted: completed right after the lease loss, nobody approved
    assert unapproved_actions([_started(), _pending(2), lost, _completed(4)], ()) == [
        f"{RUN}/pay-1#4"
    ]
