"""Which session needs a holder for its active run: the processor publishes it to workers.

A run is open when it is active, nobody holds its lease, and it is not cancelling (an
unheld cancelling run is finished at once): just started, or its holder's lease was lost.
Pure: the processor compares a session's state before and after a batch and writes the
record or its tombstone in the same transaction (sessionstream.runtimes.processor).
"""

from __future__ import annotations

from sessionstream.core.state import SessionState
from sessionstream.schemas.discovery import OpenRun

__all__ = ["open_run", "opening_key"]


def opening_key(state: SessionState | None) -> tuple[str, int, str] | None:
    """What makes the session's open-runs record new: (run, generation, status) of its run
    that needs a holder (`open_run`), or None; the clock the record carries does not."""
    if state is None or state.tenant_id is None:
        return None
    run = state.active
    if run is None or run.lease_owner is not None or run.status == "cancelling":
        return None
    return (run.run_id, run.generation, run.status)


def open_run(state: SessionState | None) -> OpenRun | None:
    """The session's run that needs a holder, or None."""
    if state is None or opening_key(state) is None:
        return None
    run = state.active
    assert run is not None and state.tenant_id is not None
    return OpenRun(
        session_id=state.session_id,
        tenant_id=state.tenant_id,
        run_id=run.run_id,
        generation=run.generation,
        status=run.status,
        prompt=run.prompt,
        context_ref=run.context_ref,
        checkpoint_ref=run.checkpoint_ref,
        previous_holder=run.last_holder,
        actor=run.actor,
        input=run.input_json,
        opened_at=state.clock,
    )
