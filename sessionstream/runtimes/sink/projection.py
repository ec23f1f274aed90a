"""The `agent_runs` / `agent_sessions` projection of the event log, as a pure fold.

Rows are folded in Python from the rows already in the database plus a batch of events, then
written back once per batch. An event whose `seq` the row has already seen changes nothing,
so replaying a batch (after a crash between commit and acknowledgement) is harmless. A
`run.started` while the session's row names another active run is a single-writer violation:
it is raised, never written.
"""

from __future__ import annotations

import json

import msgspec

from sessionstream.errors import SingleWriterViolation
from sessionstream.schemas.events import (
    SESSION_LOG,
    CancelRequested,
    ContextCheckpointed,
    Event,
    LeaseGranted,
    LeaseRenewed,
    RunFinished,
    RunStarted,
)

__all__ = ["Projection", "RunRow", "SessionRow"]


#: a row with some columns changed (msgspec's, ~10x `dataclasses.replace`: the fold makes
#: one per event, and a rebuild folds the whole log)
replace = msgspec.structs.replace


class RunRow(msgspec.Struct, frozen=True, gc=False):
    """One `agent_runs` row; times are epoch milliseconds until written."""

    run_id: str
    session_id: str
    tenant_id: str
    status: str
    generation: int
    timeout_at: int
    prompt: str
    last_seq: int
    created_at: int
    updated_at: int
    lease_owner: str | None = None
    lease_expires_at: int | None = None
    cancel_requested_at: int | None = None
    terminal_status: str | None = None
    terminal_at: int | None = None
    context_ref: str | None = None
    checkpoint_uri: str | None = None
    started_by: str | None = None
    cancelled_by: str | None = None
    retryable: bool = False
    retry_of: str | None = None
    #: the prompt's typed input, its JSON text (a `jsonb` column)
    input: str | None = None
    #: the prompt's labels (`metadata`) as a JSON object's text (a `jsonb` column; null
    #: when it had none, which keeps the run out of the labels' partial index)
    labels: str | None = None

    @property
    def active(self) -> bool:
        return self.terminal_status is None


def _labels(metadata: dict[str, str] | None) -> str | None:
    if not metadata:
        return None
    return json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


class SessionRow(msgspec.Struct, frozen=True, gc=False):
    session_id: str
    tenant_id: str
    active_run_id: str | None
    created_at: int
    updated_at: int
    #: the actor of the session's first run
    user_id: str | None = None


class Projection:
    """Rows touched by a batch: loaded ones plus what the batch's events made of them."""

    def __init__(self, runs: dict[str, RunRow], sessions: dict[str, SessionRow]) -> None:
        self.runs = runs
        self.sessions = sessions
        self.changed_runs: set[str] = set()
        self.changed_sessions: set[str] = set()

    def apply(self, e: Event, where: str | tuple[str, int, int] = "") -> None:
        """Fold one event in; `where` (topic/partition/offset, as text or as the three)
        names it in errors."""
        if e.run_id == SESSION_LOG:
            return
        if e.type == "run.started":
            self._start(e, where)
            return
        run = self.runs.get(e.run_id)
        if run is None or e.seq <= run.last_seq:
            return  # already applied (or its start is older than the projection: rebuild)
        upd: dict[str, object] = {"last_seq": e.seq, "generation": e.generation, "updated_at": e.ts}
        t = e.type
        if t == "run.lease_granted":
            g = e.payload_as(LeaseGranted)
            upd.update(lease_owner=g.worker_id, lease_expires_at=g.lease_expires_at)
        elif t == "run.lease_renewed":
            upd["lease_expires_at"] = e.payload_as(LeaseRenewed).lease_expires_at
        elif t in ("run.lease_released", "run.lease_expired"):
            upd.update(lease_owner=None, lease_expires_at=None)
        elif t == "run.compaction_started":
            upd["status"] = "compacting"
        elif t == "run.compaction_finished":
            upd["status"] = "running"
        elif t == "context.checkpointed":
            upd["checkpoint_uri"] = e.payload_as(ContextCheckpointed).uri
        elif t == "run.cancel_requested":
            c = e.payload_as(CancelRequested)
            upd.update(status="cancelling", cancel_requested_at=e.ts, cancelled_by=c.actor)
        elif t == "run.compaction_abandoned":
            upd["status"] = "running"
        elif t == "run.finished":
            f = e.payload_as(RunFinished)
            upd.update(
                status=f.terminal_status,
                terminal_status=f.terminal_status,
                terminal_at=e.ts,
                lease_owner=None,
                lease_expires_at=None,
                retryable=f.retryable,
            )
            session = self.sessions.get(e.session_id)
            if session is not None and session.active_run_id == e.run_id:
                self._session(replace(session, active_run_id=None, updated_at=e.ts))
        self.runs[e.run_id] = replace(run, **upd)
        self.changed_runs.add(e.run_id)

    def _start(self, e: Event, where: str | tuple[str, int, int]) -> None:
        if e.run_id in self.runs:
            return  # already applied
        p = e.payload_as(RunStarted)
        session = self.sessions.get(e.session_id)
        if session is not None and session.active_run_id not in (None, e.run_id):
            if isinstance(where, tuple):
                where = f"{where[0]}[{where[1]}]@{where[2]}"
            raise SingleWriterViolation(
                f"session {e.session_id}: run {e.run_id} started at {where} while run "
                f"{session.active_run_id} is still active — two writers; the sink stops"
            )
        self.runs[e.run_id] = RunRow(
            run_id=e.run_id,
            session_id=e.session_id,
            tenant_id=e.tenant_id,
            status="running",
            generation=e.generation,
            timeout_at=p.timeout_at,
            prompt=p.prompt,
            context_ref=p.context_ref,
            last_seq=e.seq,
            created_at=e.ts,
            updated_at=e.ts,
            started_by=p.actor,
            retry_of=p.retry_of,
            input=p.input,
            labels=_labels(p.metadata),
        )
        self.changed_runs.add(e.run_id)
        if session is None:
            session = SessionRow(e.session_id, e.tenant_id, None, e.ts, e.ts, user_id=p.actor)
        self._session(replace(session, active_run_id=e.run_id, updated_at=e.ts))

    def forget(self, session_id: str) -> None:
        """The session was erased: its runs and its row are no longer projected (a rebuild
        reading the log before the log cleaner removed the erased events)."""
        for run_id in [r for r, row in self.runs.items() if row.session_id == session_id]:
            del self.runs[run_id]
            self.changed_runs.discard(run_id)
        self.sessions.pop(session_id, None)
        self.changed_sessions.discard(session_id)

    def _session(self, row: SessionRow) -> None:
        self.sessions[row.session_id] = row
        self.changed_sessions.add(row.session_id)

    def runs_to_write(self) -> list[RunRow]:
        """Changed runs, terminal ones first: a run that ended frees the partial unique
        index before the session's next run is inserted in the same statement batch."""
        rows = [self.runs[r] for r in self.changed_runs]
        return sorted(rows, key=lambda r: (r.active, r.created_at, r.run_id))

    def sessions_to_write(self) -> list[SessionRow]:
        return [self.sessions[s] for s in sorted(self.changed_sessions)]
