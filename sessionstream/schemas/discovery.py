"""What workers read to find work without a consumer group: open runs and worker presence.

`session.open-runs` (compacted, key = session id, co-partitioned with the commands) holds one
record per session whose active run needs a holder — started and not leased, or whose lease
was lost — written by the processor in the transaction of the events that opened it, and a
tombstone in the transaction that closed it (a grant, the run's end). Every worker reads all
of it, so a run whose lease expired is seen by every live worker at once, wherever its
partition sits.

`session.workers` (compacted, key = worker id) holds each worker's presence, refreshed every
`interval`; a record older than three intervals (by the broker's append time) is a dead
worker. With it, workers rank themselves per run (rendezvous hashing) and only the first
acquires; the next ones wait a step each and acquire only if the run is still open.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from sessionstream.schemas._base import WireModel

__all__ = ["OpenRun", "WorkerPresence"]


class OpenRun(WireModel):
    """A run that needs a holder. A field a later version adds is ignored, not refused: a
    worker older than the processor still takes the run (the processor is often upgraded
    first)."""

    model_config = ConfigDict(extra="ignore")

    session_id: str
    tenant_id: str
    run_id: str
    #: the generation a new holder will be granted
    generation: int
    status: str
    prompt: str
    context_ref: str | None = None
    #: the run's latest `context.checkpointed` pointer: where a new holder starts from
    checkpoint_ref: str | None = None
    #: the holder that lost the lease, if any (not ranked: it is probably dead)
    previous_holder: str | None = None
    #: who asked for the run (the starting command's actor)
    actor: str | None = None
    #: the prompt's typed input, its compact JSON text (null: none); the worker parses it
    input: str | None = None
    #: the decider's clock when it opened (epoch ms)
    opened_at: int


class WorkerPresence(WireModel):
    """One worker, alive as of its record's append time."""

    worker_id: str
    #: runs it executes now, and the most it takes
    load: int = 0
    capacity: int = Field(default=100, ge=0)
    #: ms between two presence records
    interval_ms: int = Field(default=1000, gt=0)
