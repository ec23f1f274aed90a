"""Erasure: an administrator's `session.erase`, and the retention timer that erases a
session idle for `retention_ms` (docs/protocol.md, erasure and retention)."""

from __future__ import annotations

import hashlib
from typing import Literal

from sessionstream.core.decider._emit import _Emitter
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import Command, SessionErasePayload
from sessionstream.schemas.events import SESSION_LOG, SessionErased

__all__ = ["retention_due", "session_hash"]


def session_hash(session_id: str) -> str:
    """What stays of an erased session's id: `sha256:` + hex of its UTF-8."""
    return "sha256:" + hashlib.sha256(session_id.encode()).hexdigest()


def retention_due(idle_since: int | None, retention_ms: int | None) -> int | None:
    """When an idle session is erased by retention (None: never)."""
    if idle_since is None or retention_ms is None:
        return None
    return idle_since + retention_ms


def _erase(em: _Emitter, cmd: Command) -> None:
    """Refused while a run is active: the run's holder may be acting outside, and only the
    cancel protocol (abort, the holder's ack or its deadline) ends a run safely. The
    administrator aborts, waits for `run.finished`, and erases."""
    run = em.state.active
    if run is not None:
        em.reject(
            "session_busy",
            f"run {run.run_id} is {run.status}: abort it and erase once it has finished",
        )
        return
    _erased(em, "admin", cmd.payload_as(SessionErasePayload).reason)


def _erased(em: _Emitter, trigger: Literal["admin", "retention"], reason: str | None) -> None:
    em.emit(
        SESSION_LOG,
        "session.erased",
        make(
            SessionErased,
            session_hash=session_hash(em.state.session_id),
            trigger=trigger,
            reason=reason,
            actor=em.cmd.actor,
            runs_started=em.state.runs_started,
        ),
    )


def _retention(em: _Emitter) -> None:
    """Honoured only when due by the decider's clock: idle since `idle_since`, for at
    least `retention_ms`."""
    st = em.state
    due = retention_due(st.idle_since, em.config.retention_ms)
    if st.active is not None or due is None or due > em.now:
        em.reject("timer_stale", f"session not idle for the retention period at {em.now}")
        return
    _erased(em, "retention", f"retention: idle since {st.idle_since}")
