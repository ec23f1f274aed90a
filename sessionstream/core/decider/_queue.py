"""Queue control: `dequeue` removes one waiting task, `clear_queue` every one, each with an
explicit fate (`run.dequeued`) on the session log."""

from __future__ import annotations

from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.state import QueueEntry
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import Command, DequeuePayload
from sessionstream.schemas.events import SESSION_LOG, RunDequeued


def _remove(em: _Emitter, q: QueueEntry, reason: str) -> None:
    em.emit(
        SESSION_LOG,
        "run.dequeued",
        make(
            RunDequeued,
            source_command_id=q.source_command_id,
            kind=q.kind,
            reason=reason,
            actor=em.cmd.actor,
            queued_by=q.actor,
        ),
    )


def _dequeue(em: _Emitter, cmd: Command) -> None:
    task_id = cmd.payload_as(DequeuePayload).command_id
    q = em.state.queued(task_id)
    if q is not None:
        _remove(em, q, "dequeued")
        return
    # not waiting: say what became of it, as far as the session remembers
    state, run = em.state, em.state.active
    if run is not None and run.source_command_id == task_id:
        em.reject(
            "not_queued",
            f"task {task_id} has started: run {run.run_id} is {run.status}",
            target_status=run.status,
        )
        return
    if run is not None and (i := run.input(task_id)) is not None:
        em.reject(
            "not_queued",
            f"{task_id} is a {i.kind} pending on run {run.run_id}, not a queued task",
            target_status="pending",
        )
        return
    for gone in reversed(state.removed):
        if gone.source_command_id == task_id:
            by = f" by {gone.actor}" if gone.actor else ""
            em.reject(
                "not_queued",
                f"task {task_id} was removed from the queue before ({gone.reason}{by})",
                target_status=gone.reason,
            )
            return
    for done in reversed(state.finished):
        if done.source_command_id == task_id:
            em.reject(
                "not_queued",
                f"task {task_id} started as run {done.run_id}, which ended {done.status}",
                target_status=done.status,
            )
            return
    em.reject(
        "not_queued",
        f"no task {task_id} waits in the queue ({len(state.queue)} waiting)",
        target_status="unknown",
    )


def _clear_queue(em: _Emitter, cmd: Command) -> None:
    waiting = em.state.queue
    if not waiting:
        em.reject("queue_empty", "no task waits in the queue")
        return
    for q in waiting:  # in queue order; each leaves as its event is folded
        _remove(em, q, "cleared")
