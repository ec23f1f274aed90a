"""What the gateway reads from PostgreSQL: sessions, runs, their events, as JSON.

Everything here is the sink's projection, a moment behind the log (the sink's batch:
tens of milliseconds when it keeps up). A session's state is the decider's own fold
(`sessionstream.core.decider.evolve`) over the session's stored events in log order, so it says
exactly what the processor's state said at the last event the sink wrote: active run,
status, generation, queue and pending inputs. Calls take a connection and run in a
worker thread (`Database.run`).

Session ids are shown as the tenant knows them (`sessionstream.schemas.sessions.local_session_id`):
``s1`` for ``acme:s1`` when acme asks.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg

from sessionstream.core.decider import evolve
from sessionstream.core.state import Schedule, SessionState
from sessionstream.runtimes.sink.approvals import ACTION_EVENT_TYPES, actions_of
from sessionstream.runtimes.sink.questions import QUESTION_EVENT_TYPES, questions_of
from sessionstream.runtimes.sink.replay import (
    event_of_row,
    event_select,
    events_of_session,
    offsets_of_run,
)
from sessionstream.runtimes.sink.search import RUN_COLUMNS
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import SESSION_LOG, Event, RunQueued
from sessionstream.schemas.sessions import NAMESPACE_SEP, local_session_id

__all__ = [
    "event_json",
    "list_sessions",
    "run_events",
    "run_json",
    "run_view",
    "session_json",
    "session_view",
]

_RUN_COLUMNS = ", ".join(RUN_COLUMNS)


def _ms(t: datetime | None) -> int | None:
    return None if t is None else int(t.timestamp() * 1000)


def event_json(e: Event, offset: int | None = None) -> dict[str, Any]:
    """The seed's JSON event (camelCase), with its topic offset when known."""
    out = Codec.event_to_json(e)
    out["sessionId"] = local_session_id(e.tenant_id, e.session_id)
    if offset is not None:
        out["offset"] = offset
    return out


def _input(text: str | None) -> Any:
    """A typed input as its JSON value (the state holds its text)."""
    return None if text is None else json.loads(text)


def run_json(r: tuple[Any, ...], *, local_ids: bool = True) -> dict[str, Any]:
    """A row of `RUN_COLUMNS` as the API shows a run; `local_ids=False` keeps the session's
    full id (the CLI's view of the database)."""
    return {
        "runId": r[0],
        "sessionId": local_session_id(r[2], r[1]) if local_ids else r[1],
        "tenantId": r[2],
        "status": r[3],
        "generation": r[4],
        "leaseOwner": r[5],
        "leaseExpiresAt": _ms(r[6]),
        "timeoutAt": _ms(r[7]),
        "cancelRequestedAt": _ms(r[8]),
        "terminalStatus": r[9],
        "terminalAt": _ms(r[10]),
        "prompt": r[11],
        "lastSeq": r[12],
        "createdAt": _ms(r[13]),
        "updatedAt": _ms(r[14]),
        "startedBy": r[15],
        "cancelledBy": r[16],
        "retryable": r[17],
        "retryOf": r[18],
        "labels": r[19],
        # the prompt's typed input (a jsonb: its JSON value), null when it had none
        "input": r[20],
    }


def session_json(r: tuple[Any, ...], tenant_id: str) -> dict[str, Any]:
    """A row of `SESSION_COLUMNS` as the API shows a session of `tenant_id`."""
    return {
        "sessionId": local_session_id(tenant_id, r[0]),
        "activeRunId": r[2],
        "status": r[6] or "idle",
        "createdAt": _ms(r[3]),
        "updatedAt": _ms(r[4]),
        "userId": r[5],
    }


def list_sessions(
    conn: psycopg.Connection[Any], tenant_id: str, limit: int
) -> list[dict[str, Any]]:
    """A tenant's sessions the gateway reaches (in its namespace, or aliased), most
    recently updated first, with their active run's status."""
    rows = conn.execute(
        "select s.session_id, s.tenant_id, s.active_run_id, s.created_at, s.updated_at,"
        " s.user_id, r.status"
        " from agent_sessions s left join agent_runs r on r.run_id = s.active_run_id"
        " where s.tenant_id = %s and (starts_with(s.session_id, %s) or exists (select 1"
        " from session_aliases a where a.tenant_id = s.tenant_id"
        " and a.session_id = s.session_id))"
        " order by s.updated_at desc, s.session_id limit %s",
        (tenant_id, f"{tenant_id}{NAMESPACE_SEP}", limit),
    ).fetchall()
    conn.rollback()
    return [session_json(r, tenant_id) for r in rows]


def schedule_json(sc: Schedule) -> dict[str, Any]:
    """A schedule as the API shows it (times in epoch ms)."""
    return {
        "scheduleId": sc.schedule_id,
        "cron": sc.cron,
        "timezone": sc.timezone if sc.cron is not None else None,
        "intervalMs": sc.interval_ms,
        "text": sc.text,
        "input": None if sc.input_json is None else json.loads(sc.input_json),
        "timeoutMs": sc.timeout_ms,
        "contextRef": sc.context_ref,
        "overlap": sc.overlap,
        "catchUp": sc.catch_up,
        "maxCatchUp": sc.max_catch_up,
        "jitterMs": sc.jitter_ms,
        "nextAt": sc.next_at,
        "nextNominalAt": sc.next_nominal_at,
        "revision": sc.revision,
        "createdBy": sc.actor,
    }


def session_view(
    conn: psycopg.Connection[Any], session_id: str, tenant_id: str, runs: int = 20
) -> dict[str, Any] | None:
    """The session's state as the sink last saw it; None if unknown or another tenant's."""
    row = conn.execute(
        "select tenant_id, created_at, updated_at, user_id from agent_sessions"
        " where session_id = %s",
        (session_id,),
    ).fetchone()
    if row is None:
        # no run yet: the projection has no row, but a schedule gives the session its
        # owner (docs/protocol.md#schedules) — shown from its first `schedule.created`
        row = conn.execute(
            "select tenant_id, ts, (select max(ts) from agent_run_events"
            " where session_id = %s), null from agent_run_events where session_id = %s"
            " and type = 'schedule.created' order by kafka_offset limit 1",
            (session_id, session_id),
        ).fetchone()
    if row is None or row[0] != tenant_id:
        conn.rollback()
        return None
    events = events_of_session(conn, session_id)
    last = conn.execute(
        "select max(kafka_offset) from agent_run_events where session_id = %s", (session_id,)
    ).fetchone()
    recent = conn.execute(
        f"select {_RUN_COLUMNS} from agent_runs where session_id = %s"
        " order by created_at desc, run_id limit %s",
        (session_id, runs),
    ).fetchall()
    conn.rollback()
    state = SessionState.initial(session_id)
    queued_at: dict[str, int] = {}
    for e in events:
        state = evolve(state, e)
        if e.type == "run.queued":
            queued_at[e.payload_as(RunQueued).source_command_id] = e.ts
    active = state.active
    return {
        "sessionId": local_session_id(tenant_id, session_id),
        "tenantId": row[0],
        "userId": row[3],
        "createdAt": _ms(row[1]),
        "updatedAt": _ms(row[2]),
        "status": active.status if active else "idle",
        "generation": active.generation if active else None,
        "activeRun": None
        if active is None
        else {
            "runId": active.run_id,
            "status": active.status,
            "generation": active.generation,
            "leaseOwner": active.lease_owner,
            "leaseExpiresAt": active.lease_expires_at,
            "startedAt": active.started_at,
            "timeoutAt": active.timeout_at,
            "cancelRequestedAt": active.cancel_requested_at,
            "prompt": active.prompt,
            "input": _input(active.input_json),
            "pendingInputs": [
                {"sourceCommandId": i.source_command_id, "kind": i.kind, "text": i.text}
                for i in active.inputs
            ],
            # the gate's keys: pending ones wait for a person (docs/http.md#approvals)
            "actions": [
                a.json() for a in actions_of(e for e in events if e.run_id == active.run_id)
            ],
            # its questions to a person: open ones wait for an answer (docs/http.md#questions)
            "questions": [
                q.json() for q in questions_of(e for e in events if e.run_id == active.run_id)
            ],
        },
        # the waiting tasks in the order they will start, each named by the command that
        # queued it (what DELETE .../queue/{commandId} takes)
        "queue": [
            {
                "sourceCommandId": q.source_command_id,
                "kind": q.kind,
                "text": q.text,
                "actor": q.actor,
                "queuedAt": queued_at.get(q.source_command_id),
                "input": _input(q.input_json),
                "metadata": q.metadata,
            }
            for q in state.queue
        ],
        "schedules": [schedule_json(sc) for sc in state.schedules],
        "runs": [run_json(r) for r in recent],
        # resume the live stream after this (GET .../events with Last-Event-ID)
        "lastEventId": None if last is None or last[0] is None else int(last[0]),
        "eventCount": len(events),
    }


def run_view(conn: psycopg.Connection[Any], run_id: str, tenant_id: str) -> dict[str, Any] | None:
    if run_id == SESSION_LOG:  # no run: every session's own log is stored under it
        return None
    row = conn.execute(
        f"select {_RUN_COLUMNS} from agent_runs where run_id = %s", (run_id,)
    ).fetchone()
    conn.rollback()
    if row is None or row[2] != tenant_id:
        return None
    run = run_json(row)
    gate = conn.execute(
        f"{event_select()} where run_id = %s and type = any(%s) order by seq",
        (run_id, [*ACTION_EVENT_TYPES, *QUESTION_EVENT_TYPES]),
    ).fetchall()
    asked = [event_of_row(r) for r in gate]
    # the gate's keys, pending or decided, and who decided (docs/http.md#approvals); the
    # questions asked of a person, open, answered (by whom) or closed (docs/http.md#questions)
    run["actions"] = [a.json() for a in actions_of(asked)]
    run["questions"] = [q.json() for q in questions_of(asked)]
    usage = conn.execute(
        "select model_requests, input_tokens, output_tokens, cost_usd, model_ms"
        " from run_model_usage where run_id = %s",
        (run_id,),
    ).fetchone()
    conn.rollback()
    requests, tokens_in, tokens_out, cost, model_ms = usage or (0, 0, 0, None, 0)
    # what the run's model requests reported (`model.request.finished`), summed
    run["usage"] = {
        "modelRequests": int(requests),
        "inputTokens": int(tokens_in),
        "outputTokens": int(tokens_out),
        "costUsd": None if cost is None else float(cost),
        "modelMs": int(model_ms),
    }
    return run


def run_events(
    conn: psycopg.Connection[Any], run_id: str, tenant_id: str
) -> list[dict[str, Any]] | None:
    """A run's events in seq order with their offsets; None if unknown or another tenant's.
    `_session` is no run: the sessions' own logs (of every tenant) are stored under it."""
    if run_id == SESSION_LOG:
        return None
    events = offsets_of_run(conn, run_id)
    conn.rollback()
    # every row, not the first: what is not all the tenant's is not shown at all
    if not events or any(e.tenant_id != tenant_id for _, e in events):
        return None
    return [event_json(e, o) for o, e in events]
