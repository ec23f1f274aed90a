"""The events a producer reads, under the public import root: an outcome's `events`, a
session's log (`sessionstream tail`, the gateway's SSE stream), a run's replay.

    from sessionstream.events import RunStarted

    outcome = client.wait(client.prompt(sid, "find flights", policy="enqueue"))
    for event in outcome.events:
        if event.type == "run.started":
            started = event.payload_as(RunStarted)

Every event is an `Event` envelope around the payload model its `type` names; each model
below is documented in docs/protocol.md#events. These are the wire contract's own models
(`sessionstream.schemas.events`), re-exported.
"""

from sessionstream.schemas.events import (
    ACTIVE_STATUSES,
    EVENT_TYPES,
    REJECTION_REASONS,
    SESSION_LOG,
    TERMINAL_STATUSES,
    ActionCompleted,
    ActionDecision,
    ActionDecisionReplayed,
    CancelAcknowledged,
    CancelRequested,
    CommandRejected,
    CompactionAbandoned,
    CompactionFinished,
    CompactionStarted,
    ContextCheckpointed,
    Event,
    EventType,
    FollowUpDelivered,
    FollowUpQueued,
    InputConsumed,
    InputDelivered,
    InputDropped,
    InputKind,
    InputRequeued,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    Progress,
    RejectionReason,
    RoundCompleted,
    RunDequeued,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatus,
    StaleWriteRecorded,
    Steered,
    TerminalStatus,
)

__all__ = [
    "ACTIVE_STATUSES",
    "EVENT_TYPES",
    "REJECTION_REASONS",
    "SESSION_LOG",
    "TERMINAL_STATUSES",
    "ActionCompleted",
    "ActionDecision",
    "ActionDecisionReplayed",
    "CancelAcknowledged",
    "CancelRequested",
    "CommandRejected",
    "CompactionAbandoned",
    "CompactionFinished",
    "CompactionStarted",
    "ContextCheckpointed",
    "Event",
    "EventType",
    "FollowUpDelivered",
    "FollowUpQueued",
    "InputConsumed",
    "InputDelivered",
    "InputDropped",
    "InputKind",
    "InputRequeued",
    "LeaseExpired",
    "LeaseGranted",
    "LeaseReleased",
    "LeaseRenewed",
    "Progress",
    "RejectionReason",
    "RoundCompleted",
    "RunDequeued",
    "RunFinished",
    "RunQueued",
    "RunStarted",
    "RunStatus",
    "StaleWriteRecorded",
    "Steered",
    "TerminalStatus",
]
