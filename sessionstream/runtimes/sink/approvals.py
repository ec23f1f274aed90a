"""The action gate as PostgreSQL shows it: each key of a run, pending or decided, and the
pending approvals of a tenant (what a person is asked to decide).

Read from the sink's projection (`agent_run_events`), a moment behind the log: a key shown
pending may have been decided already. The decision itself is the processor's; a late
`action.approve` is rejected `action_not_pending`, never applied twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final

import psycopg

from sessionstream.runtimes.sink.replay import events_of_active_runs
from sessionstream.schemas.events import ActionCompleted, ActionDecision, ActionPending, Event

__all__ = ["ACTION_EVENT_TYPES", "ActionView", "actions_of", "pending_approvals"]

#: the events that make or change a key's record (a `decision_replayed` changes nothing)
ACTION_EVENT_TYPES: Final = (
    "action.pending",
    "action.approved",
    "action.denied",
    "action.completed",
)


@dataclass
class ActionView:
    """One key of a run: its last decision and who made it."""

    key: str
    kind: str
    decision: str  # pending | approved | denied
    #: keys that needed a person: the digest asked for and when the window closes
    args_digest: str | None = None
    expires_at: int | None = None
    #: the generation whose request is (or was last) pending
    generation: int | None = None
    reason: str | None = None
    detail: str | None = None
    decided_by: str | None = None
    decided_at: int | None = None
    completed: bool = False
    ok: bool | None = None

    def json(self) -> dict[str, Any]:
        """The API's spelling (camelCase)."""
        return {_camel(k): v for k, v in asdict(self).items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def actions_of(events: Iterable[Event]) -> list[ActionView]:
    """A run's keys from its events (in seq order), in the order they were first asked."""
    out: dict[str, ActionView] = {}
    for e in events:
        if e.type == "action.pending":
            p = e.payload_as(ActionPending)
            view = out.setdefault(p.idempotency_key, ActionView(p.idempotency_key, p.kind, ""))
            view.decision, view.reason, view.detail = "pending", None, p.detail
            view.args_digest, view.expires_at = p.args_digest, p.expires_at
            view.generation = e.generation
        elif e.type in ("action.approved", "action.denied"):
            d = e.payload_as(ActionDecision)
            view = out.setdefault(d.idempotency_key, ActionView(d.idempotency_key, d.kind, ""))
            view.decision = "approved" if e.type == "action.approved" else "denied"
            view.reason, view.decided_by, view.decided_at = d.reason, d.decided_by, e.ts
            if d.detail is not None:
                view.detail = d.detail
        elif e.type == "action.completed":
            c = e.payload_as(ActionCompleted)
            if c.idempotency_key in out:
                out[c.idempotency_key].completed, out[c.idempotency_key].ok = True, c.ok
    return list(out.values())


def pending_approvals(
    conn: psycopg.Connection[Any], tenant_id: str, limit: int = 200
) -> list[dict[str, Any]]:
    """The actions of `tenant_id`'s active runs that wait for a person, oldest window
    first: run, session (full id), key, kind, argsDigest, generation, expiresAt."""
    out: list[dict[str, Any]] = []
    for run_id, events in events_of_active_runs(conn, tenant_id, ACTION_EVENT_TYPES).items():
        for view in actions_of(events):
            if view.decision == "pending":
                out.append({"runId": run_id, "sessionId": events[0].session_id, **view.json()})
    out.sort(key=lambda a: (a["expiresAt"] or 0, a["runId"], a["key"]))
    return out[:limit]
