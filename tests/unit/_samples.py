"""One command and one event of every type, every optional field set to a non-default value."""

from __future__ import annotations

from typing import Any

from sessionstream.schemas._base import Payload
from sessionstream.schemas.commands import Command
from sessionstream.schemas.events import (
    EVENT_PAYLOADS,
    ActionCompleted,
    ActionDecision,
    ActionDecisionReplayed,
    ActionPending,
    CancelAcknowledged,
    CancelRequested,
    CommandRejected,
    CompactionAbandoned,
    CompactionFinished,
    CompactionStarted,
    ContextCheckpointed,
    Event,
    FollowUpDelivered,
    FollowUpQueued,
    InputConsumed,
    InputDelivered,
    InputDropped,
    InputRequeued,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    Progress,
    RoundCompleted,
    RunDequeued,
    RunFinished,
    RunQueued,
    RunStarted,
    ScheduleDefined,
    ScheduleDeleted,
    ScheduleFired,
    SessionErased,
    StaleWriteRecorded,
    Steered,
    StepDelivered,
    StepRecorded,
)
from sessionstream.schemas.questions import (
    QuestionAnswered,
    QuestionAsked,
    QuestionClosed,
    QuestionReplayed,
)

_WORKER = {"run_id": "r-1", "worker_id": "w-1", "generation": 3}

#: type -> (payload, worker fields?)
_COMMANDS: dict[str, tuple[dict[str, Any], bool]] = {
    "prompt": (
        {
            "text": "find flights",
            "policy": "interrupt",
            "context_ref": "ctx://1",
            "timeout_ms": 5_000,
            "retry_of": "r-0",
            "input": {"to": "LIS", "nights": 3, "flex": [1.5, None, True], "note": "é"},
            "approval_kinds": ["payment", "*"],
            "metadata": {"team": "growth", "ticket/id": "T-1", "note": "é ok"},
        },
        False,
    ),
    "steer": ({"text": "don't search that"}, False),
    "follow_up": (
        {"text": "also the last 7 days", "when_idle": "reject", "on_run_end": "queue"},
        False,
    ),
    "send": ({"text": "hi", "context_ref": "ctx://2", "timeout_ms": 9_000}, False),
    "abort": ({"reason": "deadline"}, False),
    "dequeue": ({"command_id": "cmd-queued-1"}, False),
    "clear_queue": ({}, False),
    "action.approve": (
        {"idempotency_key": "k-1", "args_digest": "sha256:ab", "generation": 2},
        False,
    ),
    "action.deny": (
        {"idempotency_key": "k-1", "args_digest": "sha256:ab", "reason": "not this one"},
        False,
    ),
    "question.answer": (
        {"question_id": "q-1", "answer": {"account": "acme-main", "n": [1, None]}, "generation": 2},
        False,
    ),
    "compact.start": ({}, True),
    "compact.finish": ({"checkpoint_uri": "s3://ck/1", "tokens": 1234}, True),
    "lease.acquire": ({"lease_ms": 1_000}, True),
    "lease.renew": ({"lease_ms": 2_000}, True),
    "lease.release": ({}, True),
    "run.progress": (
        {"kind": "tool.started", "name": "web", "call_id": "call-1", "detail": "q=x"},
        True,
    ),
    "action.request": (
        {"idempotency_key": "k-1", "kind": "email", "detail": "to bob", "args_digest": "sha256:ab"},
        True,
    ),
    "action.result": ({"idempotency_key": "k-1", "ok": False, "result": "bounced"}, True),
    "question.ask": (
        {"question_id": "q-1", "question": "Which account?", "schema": {"type": "string"}},
        True,
    ),
    "cancel.ack": (
        {
            "model_request_aborted": True,
            "tools_aborted": ["web", "sql"],
            "subtasks_cancelled": ["sub-1"],
            "actions_blocked": ["k-2"],
            "actions_executing": ["k-3"],
        },
        True,
    ),
    "run.complete": (
        {"result": "done", "consumed_follow_ups": ["c-9"], "consumed_steers": ["c-8"]},
        True,
    ),
    "run.fail": ({"error": "boom", "retryable": True}, True),
    "step.record": (
        {
            "step_id": "model-1",
            "kind": "tool",
            "name": "search",
            "input_digest": "ab12",
            "input": '{"q": "lisbon"}',
            "result": '["hit"]',
        },
        True,
    ),
    "timer.fired": ({"kind": "cancel_deadline", "due_at": 1_700_000_030_000}, False),
    "session.erase": ({"reason": "the user asked"}, False),
    "schedule.create": (
        {
            "schedule_id": "daily-report",
            "cron": "30 9 * * mon-fri",
            "timezone": "Europe/Lisbon",
            "text": "the daily report",
            "input": {"team": "ops"},
            "timeout_ms": 60_000,
            "context_ref": "ctx://3",
            "overlap": "enqueue",
            "catch_up": "all",
            "max_catch_up": 3,
            "jitter_ms": 5_000,
        },
        False,
    ),
    "schedule.update": (
        {"schedule_id": "daily-report", "interval_ms": 3_600_000, "text": "hourly"},
        False,
    ),
    "schedule.delete": ({"schedule_id": "daily-report"}, False),
}


def command(type_: str) -> Command:
    payload, worker = _COMMANDS[type_]
    extra: dict[str, Any] = dict(_WORKER) if worker else {}
    if type_ == "timer.fired":
        extra = {"run_id": "r-1", "generation": 2}
    if type_ in ("action.approve", "action.deny", "question.answer"):
        extra = {"run_id": "r-1"}
    return Command(
        command_id=f"cmd-{type_}",
        session_id="s-1",
        tenant_id="acme",
        type=type_,
        ts=1_700_000_000_000,
        actor="user:ana",
        payload=payload,
        **extra,
    )


COMMAND_TYPES = sorted(_COMMANDS)

_PROGRESS = Progress(worker_id="w-1", name="web", call_id="call-1", detail="q=x")
_DECISION = ActionDecision(
    idempotency_key="k-1", kind="email", reason="denied", detail="d", decided_by="user:bo"
)
_PAYLOADS: dict[type[Payload], Payload] = {
    RunStarted: RunStarted(
        prompt="p",
        origin="queued",
        source_command_id="c-1",
        timeout_at=99,
        context_ref="ctx://1",
        actor="user:ana",
        retry_of="r-0",
        from_checkpoint=True,
        input='{"to":"LIS"}',
        approval_kinds=["payment"],
        metadata={"team": "growth", "env": "prod"},
    ),
    RunDequeued: RunDequeued(
        source_command_id="c-3",
        kind="prompt",
        reason="cleared",
        actor="user:bo",
        queued_by="user:ana",
    ),
    RunQueued: RunQueued(
        source_command_id="c-2",
        kind="follow_up",
        text="t",
        front=True,
        context_ref="ctx://2",
        timeout_ms=5,
        actor="user:bo",
        retry_of="r-9",
        input="[1,2]",
        approval_kinds=["*"],
        metadata={"team": "growth"},
    ),
    LeaseGranted: LeaseGranted(
        worker_id="w-1",
        lease_expires_at=10,
        lease_ms=9,
        capped=True,
        checkpoint_ref="s3://ck/2",
        steps_delivered=3,
    ),
    LeaseRenewed: LeaseRenewed(worker_id="w-1", lease_expires_at=20, lease_ms=8, capped=True),
    LeaseReleased: LeaseReleased(worker_id="w-1"),
    LeaseExpired: LeaseExpired(worker_id="w-1", reason="cancel_deadline"),
    Steered: Steered(text="other way", source_command_id="c-4", actor="user:ana"),
    FollowUpQueued: FollowUpQueued(
        text="f", source_command_id="c-3", actor="user:bo", on_run_end="queue"
    ),
    FollowUpDelivered: FollowUpDelivered(text="f", source_command_id="c-3"),
    RoundCompleted: RoundCompleted(result="round 1"),
    InputDelivered: InputDelivered(source_command_id="c-3", kind="follow_up", text="f"),
    InputConsumed: InputConsumed(source_command_id="c-4", kind="steer"),
    InputDropped: InputDropped(
        source_command_id="c-3", kind="follow_up", reason="run_ended", terminal_status="failed"
    ),
    InputRequeued: InputRequeued(
        source_command_id="c-5", kind="follow_up", terminal_status="cancelled"
    ),
    Progress: _PROGRESS,
    CompactionStarted: CompactionStarted(worker_id="w-1"),
    ContextCheckpointed: ContextCheckpointed(uri="s3://ck/1", tokens=77),
    CompactionFinished: CompactionFinished(uri="s3://ck/1"),
    CompactionAbandoned: CompactionAbandoned(worker_id="w-1", reason="lease_lost"),
    ActionDecision: _DECISION,
    ActionPending: ActionPending(
        idempotency_key="k-1", kind="payment", args_digest="sha256:ab", detail="d", expires_at=9
    ),
    ActionDecisionReplayed: ActionDecisionReplayed(
        idempotency_key="k", kind="e", decision="denied"
    ),
    ActionCompleted: ActionCompleted(idempotency_key="k", ok=False, result="r"),
    QuestionAsked: QuestionAsked(
        question_id="q-1", question="Which account?", schema='{"type":"string"}', expires_at=9
    ),
    QuestionAnswered: QuestionAnswered(
        question_id="q-1", answer='{"account":"é"}', answered_by="user:ana"
    ),
    QuestionClosed: QuestionClosed(question_id="q-1", reason="lease_lost"),
    QuestionReplayed: QuestionReplayed(
        question_id="q-1", status="answered", answer="1", answered_by="user:ana", reason=None
    ),
    CancelRequested: CancelRequested(reason="user", cancel_deadline_at=30, actor="user:ana"),
    CancelAcknowledged: CancelAcknowledged(
        worker_id="w-1",
        model_request_aborted=True,
        tools_aborted=["t"],
        subtasks_cancelled=["s"],
        actions_blocked=["a"],
        actions_executing=["e"],
    ),
    RunFinished: RunFinished(terminal_status="timed_out", result="r", error="e", retryable=True),
    CommandRejected: CommandRejected(
        reason="run_not_active",
        command_type="prompt",
        target_run_id="r-0",
        detail="d",
        actor="user:ana",
        target_status="completed",
    ),
    SessionErased: SessionErased(
        session_hash="sha256:" + "ab" * 32,
        trigger="admin",
        reason="the user asked",
        actor="user:ana",
        runs_started=3,
    ),
    StaleWriteRecorded: StaleWriteRecorded(
        worker_id="w-0", command_type="run.progress", stale_generation=1, current_generation=2
    ),
    StepRecorded: StepRecorded(
        worker_id="w-1",
        step_id="tool:search-1",
        kind="tool",
        name="search",
        input_digest="ab12",
        input='{"q": "x"}',
        result_ref="s3://steps/1",
    ),
    ScheduleDefined: ScheduleDefined(
        schedule_id="daily-report",
        cron="30 9 * * mon-fri",
        timezone="Europe/Lisbon",
        text="the daily report",
        input='{"team":"ops"}',
        timeout_ms=60_000,
        context_ref="ctx://3",
        overlap="interrupt",
        catch_up="all",
        max_catch_up=3,
        jitter_ms=5_000,
        anchor_at=1_700_000_000_000,
        next_nominal_at=1_700_040_600_000,
        next_at=1_700_040_602_000,
        actor="user:ana",
    ),
    ScheduleDeleted: ScheduleDeleted(schedule_id="daily-report", actor="user:ana"),
    ScheduleFired: ScheduleFired(
        schedule_id="daily-report",
        nominal_at=1_700_040_600_000,
        outcome="skipped",
        reason="busy",
        missed=2,
        caught_up=1,
        next_nominal_at=1_700_127_000_000,
        next_at=1_700_127_001_000,
    ),
    StepDelivered: StepDelivered(
        step_id="model-1",
        kind="model",
        name="gpt",
        input_digest="cd34",
        result='"hello"',
        generation=1,
    ),
}


def event(type_: str) -> Event:
    return Event(
        session_id="s-1",
        run_id="r-1",
        seq=7,
        type=type_,
        payload=_PAYLOADS[EVENT_PAYLOADS[type_]],
        generation=2,
        command_id="c-7",
        ts=1_700_000_000_000,
        tenant_id="acme",
        producer_ts=1_699_999_999_000,
    )


EVENT_TYPES = sorted(EVENT_PAYLOADS)
