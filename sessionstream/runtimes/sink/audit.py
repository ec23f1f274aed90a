"""`sessionstream audit`: the seed's pre-launch checklist, run against the live system.

Each of the ten points is PASS or FAIL with the evidence that decided it: counts, the
first offenders by id, the topic settings read from the broker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.topics import check_topics
from sessionstream.core import decider
from sessionstream.core.approvals import parse_approval_kinds, unapproved_actions
from sessionstream.errors import SessionstreamError
from sessionstream.runtimes.sink.replay import event_of_row, event_select
from sessionstream.schemas.commands import COMMAND_PAYLOADS
from sessionstream.settings import Settings

__all__ = ["Check", "run_audit"]

ACTIVE = "('running', 'compacting', 'cancelling')"


@dataclass
class Check:
    number: int
    title: str
    ok: bool = True
    evidence: list[str] = field(default_factory=list)

    def fail(self, what: str, rows: list[Any] | None = None) -> None:
        self.ok = False
        shown = "" if rows is None else f": {', '.join(map(str, rows[:5]))}"
        more = f" (+{len(rows) - 5} more)" if rows is not None and len(rows) > 5 else ""
        self.evidence.append(f"FAIL {what}{shown}{more}")

    def note(self, what: str) -> None:
        self.evidence.append(what)


def _rows(conn: psycopg.Connection[Any], sql: str, *args: Any) -> list[Any]:
    return conn.execute(sql, args).fetchall()


def _one(conn: psycopg.Connection[Any], sql: str, *args: Any) -> Any:
    row = conn.execute(sql, args).fetchone()
    return row[0] if row else None


def _single_writer(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    two = _rows(
        conn,
        f"select session_id from agent_runs where status in {ACTIVE}"
        " group by session_id having count(*) > 1",
    )
    if two:
        c.fail("sessions with more than one active run", [r[0] for r in two])
    idx = _one(
        conn,
        "select indexdef from pg_indexes where indexname ="
        " 'only_one_active_run_per_session' and schemaname = current_schema()",
    )
    if not idx or "WHERE" not in idx:
        c.fail("partial unique index only_one_active_run_per_session missing")
    active = _one(conn, f"select count(*) from agent_runs where status in {ACTIVE}")
    c.note(f"{active} active runs; backstop index present: {bool(idx)}")
    try:
        report = check_topics(settings)
        counts = {k: v for k, v in report.partitions.items() if k != settings.dlq_topic}
        c.note(f"partition counts {counts}")
    except SessionstreamError as e:
        c.fail(str(e))
        return
    wrong = [
        r
        for r in read_topic(settings, settings.dlq_topic)
        if r.headers.get("error.reason") == b"wrong_partition"
    ]
    if wrong:
        c.fail(
            "commands produced with a non-murmur2 partitioner (dead-lettered)",
            [f"{r.key!r}" for r in wrong],
        )
    else:
        c.note("no command arrived on a partition its key does not hash to (murmur2)")


def _append_only(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    gaps = _rows(
        conn,
        "select session_id || '/' || run_id from agent_run_events"
        " group by session_id, run_id having min(seq) <> 1 or max(seq) <> count(*)",
    )
    if gaps:
        c.fail("runs with gaps or duplicates in seq", [r[0] for r in gaps])
    try:
        policy = check_topics(settings).configs[settings.events_topic].get("cleanup.policy")
    except SessionstreamError as e:
        c.fail(str(e))
        return
    c.note(f"{settings.events_topic} cleanup.policy={policy}; unique (session_id, run_id, seq)")


def _entry_semantics(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    handled = decider.HANDLED_COMMAND_TYPES
    missing = sorted(set(COMMAND_PAYLOADS) - handled)
    if missing:
        c.fail("command types without an explicit rule", missing)
    reasons = {
        r[0]
        for r in _rows(
            conn,
            "select distinct payload->>'reason' from agent_run_events"
            " where type = 'command.rejected'",
        )
    }
    unknown = sorted(str(r) for r in reasons - decider.REJECTION_REASONS)
    if unknown:
        c.fail("rejections with reasons outside the protocol", unknown)
    c.note(
        f"{len(COMMAND_PAYLOADS)} command types each with a rule; rejection reasons seen: "
        f"{sorted(str(r) for r in reasons) or 'none'}"
    )


def _cancel_reach(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    late = _rows(
        conn,
        """
        select a.session_id || '/' || a.run_id from agent_run_events a
        join agent_run_events r on r.session_id = a.session_id and r.run_id = a.run_id
         and r.type = 'run.cancel_requested' and a.seq > r.seq
        where a.type = 'action.approved'""",
    )
    if late:
        c.fail("actions approved after the cancel was requested", [r[0] for r in late])
    unacked = _rows(
        conn,
        """
        select r.run_id from agent_runs r where r.status = 'cancelled'
         and r.cancel_requested_at is not null
         and not exists (select 1 from agent_run_events e where e.run_id = r.run_id
              and e.type in ('run.cancel_acknowledged', 'run.lease_expired',
                             'run.lease_released'))
         and exists (select 1 from agent_run_events e where e.run_id = r.run_id
              and e.type = 'run.lease_granted')""",
    )
    if unacked:
        c.fail(
            "runs cancelled with a holder but no acknowledgement, release or lease loss",
            [r[0] for r in unacked],
        )
    acks = _one(
        conn, "select count(*) from agent_run_events where type = 'run.cancel_acknowledged'"
    )
    c.note(f"{acks} cancel acknowledgements; no action approved after a cancel request")


def _timeouts(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    overdue = _rows(
        conn,
        f"select run_id from agent_runs where status in {ACTIVE}"
        " and timeout_at < now() - interval '60 seconds'",
    )
    if overdue:
        c.fail("active runs more than 60 s past their deadline", [r[0] for r in overdue])
    done = _one(conn, "select count(*) from agent_runs where terminal_status is not null")
    c.note(f"every run has timeout_at (NOT NULL); {done} runs terminal")


def _leases(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    unleased = _rows(
        conn,
        """
        select e.session_id || '/' || e.run_id || '#' || e.seq from agent_run_events e
        where e.type in ('model.request.started', 'tool.started', 'action.approved')
          and not exists (select 1 from agent_run_events g where g.run_id = e.run_id
              and g.type = 'run.lease_granted' and g.seq < e.seq
              and g.generation = e.generation)""",
    )
    if unleased:
        c.fail("worker writes without a lease of their generation", [r[0] for r in unleased])
    stale = _one(
        conn, "select count(*) from agent_run_events where type = 'run.stale_write_recorded'"
    )
    c.note(f"worker writes carry the lease's generation; {stale} stale writes fenced and recorded")


def _idempotency(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    keyless = _one(
        conn,
        "select count(*) from agent_run_events where type in"
        " ('action.approved', 'action.denied') and"
        " coalesce(payload->>'idempotencyKey', '') = ''",
    )
    if keyless:
        c.fail(f"{keyless} action decisions without an idempotency key")
    twice = _rows(
        conn,
        "select run_id || ':' || (payload->>'idempotencyKey') from agent_run_events"
        " where type = 'action.approved' group by run_id, payload->>'idempotencyKey'"
        " having count(*) > 1",
    )
    if twice:
        c.fail("idempotency keys approved twice", [r[0] for r in twice])
    executed = _one(conn, "select to_regclass('agent_actions') is not null")
    if executed:
        n = _one(conn, "select count(*) from agent_actions")
        c.note(f"agent_actions holds {n} executed actions under a unique key")
    approved = _one(conn, "select count(*) from agent_run_events where type = 'action.approved'")
    c.note(f"{approved} approvals, each with a key, none twice")


def _replayable(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    short = _rows(
        conn,
        """
        select r.run_id from agent_runs r
        left join (select run_id, count(*) n, max(seq) m from agent_run_events group by run_id) e
          on e.run_id = r.run_id
        where e.n is distinct from r.last_seq or e.m is distinct from r.last_seq""",
    )
    if short:
        c.fail("runs whose stored events do not replay to their last seq", [r[0] for r in short])
    runs = _one(conn, "select count(*) from agent_runs")
    c.note(f"{runs} runs replay completely by run id (events 1..last_seq present)")


def _approvals(c: Check, conn: psycopg.Connection[Any], kinds: str) -> None:
    policy = parse_approval_kinds(kinds)
    rows = _rows(
        conn,
        f"{event_select()} where run_id in (select run_id from agent_run_events"
        " where type = 'action.completed') and type in ('run.started', 'action.pending',"
        " 'action.approved', 'action.denied', 'action.completed') order by run_id, seq",
    )
    bad = unapproved_actions([event_of_row(r) for r in rows], policy)
    if bad:
        c.fail("actions completed without the person's approval their kind needs", bad)
    completed = sum(1 for r in rows if r[3] == "action.completed")
    pending = _one(conn, "select count(*) from agent_run_events where type = 'action.pending'")
    c.note(
        f"{completed} completed actions; {pending} approvals asked of a person; policy "
        f"{kinds or '(none)'} and each run's approvalKinds"
    )


def _erased(c: Check, conn: psycopg.Connection[Any], settings: Settings) -> None:
    from sessionstream.runtimes.sink.audit_erasure import erased_leftovers

    _n, left, notes = erased_leftovers(settings, conn)
    if left:
        c.fail("records of erased sessions still readable", left)
    for n in notes:
        c.note(n)


CHECKS: list[tuple[str, Callable[[Check, psycopg.Connection[Any], Settings], None]]] = [
    ("at most one active run per session", _single_writer),
    ("history append-only and ordered", _append_only),
    ("explicit entry semantics for prompt / steer / follow-up / abort", _entry_semantics),
    ("cancel reaches model, tools, sub-tasks, actions", _cancel_reach),
    ("every run has a timeout and a terminal status", _timeouts),
    ("workers use lease + generation", _leases),
    ("external actions carry idempotency keys", _idempotency),
    ("the event stream replays completely by run id", _replayable),
    ("nothing of an erased session is readable", _erased),
]
_APPROVALS = "no action executed without its required approval"


def run_audit(
    settings: Settings, conn: psycopg.Connection[Any], *, policy: str = ""
) -> list[Check]:
    """All ten checks; read-only. `policy`: the approval kinds the processors run with
    (`SESSIONSTREAM_APPROVAL_KINDS`; the tenth check judges by it and by each run's own
    kinds)."""
    out = []
    for i, (title, fn) in enumerate(CHECKS, start=1):
        check = Check(i, title)
        fn(check, conn, settings)
        out.append(check)
    check = Check(len(CHECKS) + 1, _APPROVALS)
    _approvals(check, conn, policy)
    out.append(check)
    conn.rollback()
    return out
