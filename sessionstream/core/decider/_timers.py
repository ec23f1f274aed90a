"""The processor's timers: run deadlines, leases, cancel grace, approval expiry."""

from __future__ import annotations

from sessionstream.core.decider._base import _LEASE_LOST
from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.decider._erase import _retention
from sessionstream.core.decider._runs import (
    _close_open_calls,
    _finish,
    _lose_lease,
    _resolve_pending,
)
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import (
    Command,
    TimerFiredPayload,
)
from sessionstream.schemas.events import (
    ActionDecision,
    LeaseExpired,
)


def _timer(em: _Emitter, cmd: Command) -> None:
    """A timer is honoured only if it is due by the decider's own clock, for the active run
    at its current generation: a forged or early one changes nothing."""
    p = cmd.payload_as(TimerFiredPayload)
    if p.kind == "retention":
        _retention(em)
        return
    run = em.state.active
    if run is None or run.run_id != cmd.run_id:
        em.reject("timer_stale", f"run {cmd.run_id} is not active")
        return
    if cmd.generation != run.generation:
        em.reject("timer_stale", f"generation {cmd.generation} != current {run.generation}")
        return
    now = em.now
    if p.kind == "lease_expiry":
        if run.lease_owner is None or run.lease_expires_at is None or run.lease_expires_at > now:
            em.reject("timer_stale", f"lease renewed, released or not expired at {now}")
            return
        _lose_lease(
            em,
            run,
            "run.lease_expired",
            make(LeaseExpired, worker_id=run.lease_owner, reason="lease_expiry"),
        )
        if run.status == "cancelling":
            _finish(em, "cancelled")
    elif p.kind == "approval_expiry":
        due = [(k, a) for k, a in run.pending_actions() if (a.expires_at or 0) <= now]
        if not due:
            em.reject("timer_stale", f"no pending approval has expired at {now}")
            return
        for key, a in due:
            em.on_run(
                "action.denied",
                make(
                    ActionDecision,
                    idempotency_key=key,
                    kind=a.kind,
                    reason="approval_expired",
                    detail=f"no decision by {a.expires_at}",
                ),
            )
    elif p.kind == "run_deadline":
        if run.timeout_at > now:
            em.reject("timer_stale", f"deadline {run.timeout_at} not reached at {now}")
            return
        _finish(em, "timed_out", error=f"deadline {run.timeout_at} passed", retryable=True)
    else:  # cancel_deadline
        if (
            run.status != "cancelling"
            or run.cancel_deadline_at is None
            or run.cancel_deadline_at > now
        ):
            em.reject("timer_stale", f"run not cancelling or cancel deadline not reached at {now}")
            return
        if run.lease_owner is not None:
            _resolve_pending(em, _LEASE_LOST)
            em.on_run(
                "run.lease_expired",
                make(LeaseExpired, worker_id=run.lease_owner, reason="cancel_deadline"),
                generation=run.generation + 1,
            )
            _close_open_calls(em, run)
        _finish(em, "cancelled")
