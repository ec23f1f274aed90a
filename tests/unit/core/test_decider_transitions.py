"""Every transition of the run state machine and every rejection reason, one table row each.

A row: the state the session is brought to, the command, the events it must give (as tokens,
see `_harness.token`) and the run status after it. `Harness.apply` also checks, after every
command, the whole log against the reference model (`_model.LogModel`: seq, one active run,
generations, leases, ...) and that `apply`'s state is the fold of the log.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from sessionstream.core.decider import DEFAULT_CONFIG, REJECTION_REASONS, DeciderConfig
from sessionstream.schemas.commands import CommandClass
from tests.unit._harness import (
    Harness,
    cancelling,
    compacting,
    idle,
    leased,
    running,
    tokens,
    with_follow_up,
)

Act = Callable[[Harness], Any]
QUEUE1 = DeciderConfig(max_queue=1)
INPUTS1 = DeciderConfig(max_inputs=1)
HELD = DeciderConfig(max_held_bytes=8)  # the arranged prompt "p0" holds 2 bytes
ACTIONS1 = DeciderConfig(max_actions=1)
SMALL = DeciderConfig(max_payload_bytes=128)
SCHEDULES1 = DeciderConfig(max_schedules=1)


def schedule_timer_after_delete(h: Harness) -> Any:
    """A schedule's firing already on its way when the schedule is deleted."""
    h.schedule()
    t = h.timer("schedule")
    h.delete_schedule()
    return h.apply(t)


def stale_lease_timer(h: Harness) -> Any:
    """The lease-expiry timer of a lease that was renewed before the timer was processed."""
    old = h.timer("lease_expiry")
    h.now = old.ts - 1
    h.work("lease.renew", {"lease_ms": 60_000})
    h.now = old.ts
    return h.apply(old)


def older_generation_timer(h: Harness) -> Any:
    """A lease-expiry timer of generation 1, processed after w2 took generation 2 and its own
    short lease ran out too: it is not that lease's timer (that one comes with generation 2)."""
    old = h.timer("lease_expiry")
    h.now = old.ts - 10_000
    h.work("lease.release")
    h.acquire("w2", lease_ms=1_000)
    h.now = old.ts
    return h.apply(old)


def deadline_early(h: Harness) -> Any:
    run = h.state.active
    assert run is not None
    payload = {"kind": "run_deadline", "due_at": run.timeout_at}
    return h.do("timer.fired", payload, run_id=run.run_id, generation=1, ts=run.timeout_at - 1)


def after_complete(act: Act) -> Act:
    def go(h: Harness) -> Any:
        h.work("run.complete", {"result": "done"})
        return act(h)

    return go


def twice(act: Act) -> Act:
    def go(h: Harness) -> Any:
        act(h)
        return act(h)

    return go


def on(via: CommandClass, act: Act) -> Act:
    """`act`'s command as read from the topic of class `via`."""

    def go(h: Harness) -> Any:
        h.via = via
        return act(h)

    return go


def timer_for_unknown_run(h: Harness) -> Any:
    cmd = h.command("timer.fired", {"kind": "run_deadline", "due_at": 0}, run_id="gone")
    return h.apply(cmd)


def complete_consuming_all(h: Harness) -> Any:
    """The worker already used every pending follow-up in its answer."""
    assert h.state.active is not None
    consumed = [i.source_command_id for i in h.state.active.inputs]
    return h.work("run.complete", {"consumed_follow_ups": consumed})


def next_run_then(act: Act) -> Act:
    """The arranged run completes and a new one starts: `act` then names the old one."""

    def go(h: Harness) -> Any:
        h.old_run = h.last_run  # type: ignore[attr-defined]
        h.work("run.complete", {"result": "done"})
        h.prompt("next")
        return act(h)

    return go


def naming_old(type_: str, payload: dict[str, Any]) -> Act:
    return next_run_then(lambda h: h.do(type_, payload, run_id=h.old_run))


def reused_id(h: Harness) -> Any:
    h.do("steer", {"text": "a"}, command_id="same")
    return h.do("steer", {"text": "b"}, command_id="same")


def retry_of(end: Act) -> Act:
    def go(h: Harness) -> Any:
        old = h.last_run
        end(h)
        return h.do("prompt", {"text": "again", "retry_of": old})

    return go


def with_steer_and_follow_up_then_expired(h: Harness) -> None:
    leased(h)
    h.steer("s1")
    h.follow_up("f1")
    h.fire("lease_expiry")


def approve_then(act: Act) -> Act:
    def go(h: Harness) -> Any:
        h.work("action.request", {"idempotency_key": "k1", "kind": "email"})
        return act(h)

    return go


REQ = {"idempotency_key": "k1", "kind": "email"}
#: payments wait for a person (the settings' policy); this request asks for one
APPROVALS = DeciderConfig(approval_policy=(("*", "payment"),), approval_ttl_ms=60_000)
PAY = {"idempotency_key": "k1", "kind": "payment", "args_digest": "sha256:aa"}


def pending_then(act: Act) -> Act:
    """w1 asks for a payment: pending, waiting for a person; then `act`."""

    def go(h: Harness) -> Any:
        h.work("action.request", PAY)
        return act(h)

    return go


def past_the_window(act: Act) -> Act:
    def go(h: Harness) -> Any:
        h.now += APPROVALS.approval_ttl_ms
        return act(h)

    return go


#: questions to a person (docs/protocol.md#questions-to-a-person)
QUESTIONS = DeciderConfig(question_ttl_ms=60_000, max_answer_bytes=16, max_questions=1)


def asked_then(act: Act) -> Act:
    """w1 asks a person q1; then `act`."""

    def go(h: Harness) -> Any:
        h.ask()
        return act(h)

    return go


def past_the_question(act: Act) -> Act:
    def go(h: Harness) -> Any:
        h.now += QUESTIONS.question_ttl_ms
        return act(h)

    return go


RES = {"idempotency_key": "k1", "ok": True}
FIN = "run.finished"
STEPS2 = DeciderConfig(max_steps=2)
STEP_BYTES = DeciderConfig(max_run_step_bytes=40)


def step(step_id: str = "model-1", result: str | None = '"ok"', **kw: Any) -> Act:
    return lambda h: h.work(
        "step.record", {"step_id": step_id, "kind": "model", "result": result, **kw}
    )


def steps_then(*acts: Act) -> Act:
    def go(h: Harness) -> Any:
        out: Any = None
        for a in acts:
            out = a(h)
        return out

    return go


def taken_over_with_steps(h: Harness) -> Any:
    """w1 recorded two steps and a checkpoint, then lost its lease: w2's grant gets them."""
    step("model-1")(h)
    step("tool:search-1", kind="tool", result_ref="s3://steps/2", result=None)(h)
    h.work("lease.release")
    return h.acquire("w2")


# (id, arrange, act, expected event tokens, status after, config): a table, kept as one
# fmt: off
CASES: list[tuple[str, Callable[[Harness], None], Act, list[str], str | None, DeciderConfig]] = [
    # runs start
    ("idle-prompt", idle, lambda h: h.prompt(), ["run.started:prompt"], "running", DEFAULT_CONFIG),
    ("idle-send", idle, lambda h: h.send(), ["run.started:send"], "running", DEFAULT_CONFIG),
    ("idle-follow_up", idle, lambda h: h.follow_up(), ["run.started:follow_up"], "running",
     DEFAULT_CONFIG),
    ("idle-follow_up-when_idle_reject", idle, lambda h: h.follow_up(when_idle="reject"),
     ["rejected:no_active_run"], None, DEFAULT_CONFIG),
    # durable steps
    ("running-step.record", leased, step(), ["step.recorded"], "running", DEFAULT_CONFIG),
    ("compacting-step.record", compacting, step(), ["step.recorded"], "compacting",
     DEFAULT_CONFIG),
    ("cancelling-step.record", cancelling, step(), ["step.recorded"], "cancelling",
     DEFAULT_CONFIG),
    ("step.record-twice", leased, steps_then(step(), step(result='"other"')),
     ["rejected:step_already_recorded"], "running", DEFAULT_CONFIG),
    ("step.record-too-large", leased, step(result='"' + "x" * 8 * 1024 + '"'),
     ["rejected:step_too_large"], "running", DEFAULT_CONFIG),
    ("step.record-too-many", leased, steps_then(step("a"), step("b"), step("c")),
     ["rejected:too_many_steps"], "running", STEPS2),
    ("step.record-too-many-bytes", leased,
     steps_then(step("a", result='"' + "x" * 20 + '"'), step("b", result='"' + "y" * 20 + '"')),
     ["rejected:too_many_steps"], "running", STEP_BYTES),
    ("step.record-not-holder", leased, lambda h: h.work(
        "step.record", {"step_id": "s", "kind": "tool", "result": "1"}, worker="w2"),
     ["rejected:not_lease_holder"], "running", DEFAULT_CONFIG),
    ("step.record-stale", leased, lambda h: h.work(
        "step.record", {"step_id": "s", "kind": "tool", "result": "1"}, generation=0),
     ["rejected:stale_generation", "run.stale_write_recorded"], "running", DEFAULT_CONFIG),
    ("step.record-after-run-ended", leased, after_complete(step()),
     ["rejected:run_finished"], None, DEFAULT_CONFIG),
    ("lease-lost-closes-open-calls", leased, steps_then(
        lambda h: h.work("run.progress", {"kind": "tool.started", "name": "s", "call_id": "t1"}),
        lambda h: h.work("run.progress", {"kind": "model.request.started", "call_id": "m1"}),
        lambda h: h.work("run.progress", {"kind": "tool.finished", "name": "s", "call_id": "t1"}),
        lambda h: h.work("run.progress", {"kind": "subtask.started", "call_id": "s1"}),
        lambda h: h.fire("lease_expiry")),
     ["run.lease_expired:lease_expiry", "model.request.finished", "subtask.finished"], "running",
     DEFAULT_CONFIG),
    ("compacting-release-closes-open-calls", compacting, steps_then(
        lambda h: h.work("run.progress", {"kind": "tool.started", "call_id": "t1"}),
        lambda h: h.work("lease.release")),
     ["run.lease_released", "run.compaction_abandoned", "tool.finished"], "running",
     DEFAULT_CONFIG),
    ("takeover-delivers-steps", leased, taken_over_with_steps,
     ["run.lease_granted", "step.delivered", "step.delivered"], "running", DEFAULT_CONFIG),
    # compaction
    ("running-compact.start", leased, lambda h: h.work("compact.start"),
     ["run.compaction_started"], "compacting", DEFAULT_CONFIG),
    ("compacting-compact.finish", compacting,
     lambda h: h.work("compact.finish", {"checkpoint_uri": "s3://b/ck1", "tokens": 900}),
     ["context.checkpointed", "run.compaction_finished"], "running", DEFAULT_CONFIG),
    ("compacting-lease.release", compacting, lambda h: h.work("lease.release"),
     ["run.lease_released", "run.compaction_abandoned"], "running", DEFAULT_CONFIG),
    ("compacting-compact.start", compacting, lambda h: h.work("compact.start"),
     ["rejected:invalid_state"], "compacting", DEFAULT_CONFIG),
    ("running-compact.finish", leased,
     lambda h: h.work("compact.finish", {"checkpoint_uri": "s3://b/ck1"}),
     ["rejected:invalid_state"], "running", DEFAULT_CONFIG),
    ("cancelling-compact.start", cancelling, lambda h: h.work("compact.start"),
     ["rejected:invalid_state"], "cancelling", DEFAULT_CONFIG),
    # cancellation
    ("running-abort", leased, lambda h: h.abort(), ["run.cancel_requested"], "cancelling",
     DEFAULT_CONFIG),
    ("compacting-abort", compacting, lambda h: h.abort(), ["run.cancel_requested"], "cancelling",
     DEFAULT_CONFIG),
    ("unleased-abort-cancelled-at-once", running, lambda h: h.abort(),
     ["run.cancel_requested", f"{FIN}:cancelled"], None, DEFAULT_CONFIG),
    ("cancelling-cancel.ack", cancelling,
     lambda h: h.work("cancel.ack", {"model_request_aborted": True, "tools_aborted": ["t1"]}),
     ["run.cancel_acknowledged", f"{FIN}:cancelled"], None, DEFAULT_CONFIG),
    ("cancelling-lease_expiry", cancelling, lambda h: h.fire("lease_expiry"),
     ["run.lease_expired:lease_expiry", f"{FIN}:cancelled"], None, DEFAULT_CONFIG),
    ("cancelling-cancel_deadline", cancelling, lambda h: h.fire("cancel_deadline"),
     ["run.lease_expired:cancel_deadline", f"{FIN}:cancelled"], None, DEFAULT_CONFIG),
    ("cancelling-lease.release", cancelling, lambda h: h.work("lease.release"),
     ["run.lease_released", f"{FIN}:cancelled"], None, DEFAULT_CONFIG),
    ("cancelling-abort", cancelling, lambda h: h.abort(), ["rejected:already_cancelling"],
     "cancelling", DEFAULT_CONFIG),
    ("idle-abort", idle, lambda h: h.abort(), ["rejected:no_active_run"], None, DEFAULT_CONFIG),
    ("running-cancel.ack", leased, lambda h: h.work("cancel.ack"), ["rejected:not_cancelling"],
     "running", DEFAULT_CONFIG),
    # deadlines: any active state times out
    ("running-run_deadline", leased, lambda h: h.fire("run_deadline"), [f"{FIN}:timed_out"], None,
     DEFAULT_CONFIG),
    ("compacting-run_deadline", compacting, lambda h: h.fire("run_deadline"),
     [f"{FIN}:timed_out"], None, DEFAULT_CONFIG),
    ("cancelling-run_deadline", cancelling, lambda h: h.fire("run_deadline"),
     [f"{FIN}:timed_out"], None, DEFAULT_CONFIG),
    # worker results
    ("running-complete", leased, lambda h: h.work("run.complete", {"result": "ok"}),
     [f"{FIN}:completed"], None, DEFAULT_CONFIG),
    ("running-fail", leased, lambda h: h.work("run.fail", {"error": "boom"}), [f"{FIN}:failed"],
     None, DEFAULT_CONFIG),
    ("compacting-fail", compacting, lambda h: h.work("run.fail", {"error": "boom"}),
     [f"{FIN}:failed"], None, DEFAULT_CONFIG),
    ("compacting-complete", compacting, lambda h: h.work("run.complete"),
     ["rejected:invalid_state"], "compacting", DEFAULT_CONFIG),
    ("cancelling-complete", cancelling, lambda h: h.work("run.complete"),
     ["rejected:run_cancelling"], "cancelling", DEFAULT_CONFIG),
    ("cancelling-fail", cancelling, lambda h: h.work("run.fail", {"error": "x"}),
     ["rejected:run_cancelling"], "cancelling", DEFAULT_CONFIG),
    # prompt policies while a run is active
    ("running-prompt-reject", leased, lambda h: h.prompt(), ["rejected:session_busy"], "running",
     DEFAULT_CONFIG),
    ("compacting-prompt-reject", compacting, lambda h: h.prompt(),
     ["rejected:session_compacting"], "compacting", DEFAULT_CONFIG),
    ("cancelling-prompt-reject", cancelling, lambda h: h.prompt(), ["rejected:session_busy"],
     "cancelling", DEFAULT_CONFIG),
    ("running-prompt-enqueue", leased, lambda h: h.prompt(policy="enqueue"), ["run.queued"],
     "running", DEFAULT_CONFIG),
    ("compacting-prompt-enqueue", compacting, lambda h: h.prompt(policy="enqueue"),
     ["run.queued"], "compacting", DEFAULT_CONFIG),
    ("cancelling-prompt-enqueue", cancelling, lambda h: h.prompt(policy="enqueue"),
     ["run.queued"], "cancelling", DEFAULT_CONFIG),
    ("running-prompt-interrupt", leased, lambda h: h.prompt(policy="interrupt"),
     ["run.queued", "run.cancel_requested"], "cancelling", DEFAULT_CONFIG),
    ("compacting-prompt-interrupt", compacting, lambda h: h.prompt(policy="interrupt"),
     ["run.queued", "run.cancel_requested"], "cancelling", DEFAULT_CONFIG),
    ("cancelling-prompt-interrupt", cancelling, lambda h: h.prompt(policy="interrupt"),
     ["run.queued"], "cancelling", DEFAULT_CONFIG),
    ("unleased-prompt-interrupt", running, lambda h: h.prompt(policy="interrupt"),
     ["run.queued", "run.cancel_requested", f"{FIN}:cancelled", "run.started:queued"],
     "running", DEFAULT_CONFIG),
    ("running-enqueue-queue_full", leased, twice(lambda h: h.prompt(policy="enqueue")),
     ["rejected:queue_full"], "running", QUEUE1),
    ("running-interrupt-queue_full", leased,
     lambda h: (h.prompt(policy="enqueue"), h.prompt(policy="interrupt"))[1],
     ["rejected:queue_full"], "running", QUEUE1),
    ("running-follow_up-queue_full", leased, twice(lambda h: h.follow_up()),
     ["rejected:queue_full"], "running", INPUTS1),
    ("running-steer-queue_full", leased, twice(lambda h: h.steer()),
     ["rejected:queue_full"], "running", INPUTS1),
    ("running-enqueue-held-bytes", leased, lambda h: h.prompt("1234567", policy="enqueue"),
     ["rejected:queue_full"], "running", HELD),
    ("running-steer-held-bytes", leased, lambda h: h.steer("1234567"),
     ["rejected:queue_full"], "running", HELD),
    # send picks the mode from the state
    ("running-send", leased, lambda h: h.send(), ["run.follow_up_queued"], "running",
     DEFAULT_CONFIG),
    ("compacting-send", compacting, lambda h: h.send(), ["run.follow_up_queued"], "compacting",
     DEFAULT_CONFIG),
    ("cancelling-send", cancelling, lambda h: h.send(), ["run.queued"], "cancelling",
     DEFAULT_CONFIG),
    # follow-ups
    ("running-follow_up", leased, lambda h: h.follow_up(), ["run.follow_up_queued"], "running",
     DEFAULT_CONFIG),
    ("compacting-follow_up", compacting, lambda h: h.follow_up(), ["run.follow_up_queued"],
     "compacting", DEFAULT_CONFIG),
    ("cancelling-follow_up", cancelling, lambda h: h.follow_up(), ["run.queued"], "cancelling",
     DEFAULT_CONFIG),
    ("cancelling-follow_up-when_idle_reject", cancelling,
     lambda h: h.follow_up(when_idle="reject"), ["rejected:run_cancelling"], "cancelling",
     DEFAULT_CONFIG),
    ("cancel.ack-drops-pending-follow_up", with_follow_up,
     lambda h: (h.abort(), h.work("cancel.ack"))[1],
     ["run.cancel_acknowledged", "run.input_dropped", f"{FIN}:cancelled"], None, DEFAULT_CONFIG),
    ("complete-delivers-follow_up-not-finish", with_follow_up, lambda h: h.work("run.complete"),
     ["run.round_completed", "run.follow_up_delivered"], "running", DEFAULT_CONFIG),
    ("complete-consumed-follow_up-finishes", with_follow_up,
     complete_consuming_all,
     ["run.input_consumed", f"{FIN}:completed"], None, DEFAULT_CONFIG),
    ("complete-unconsumed-steer-dropped", leased, lambda h: (h.steer(), h.work("run.complete"))[1],
     ["run.input_dropped", f"{FIN}:completed"], None, DEFAULT_CONFIG),
    ("complete-consumed-steer", leased,
     lambda h: h.work("run.complete", {"consumed_steers": [h.steer()[0].command_id]}),
     ["run.input_consumed", f"{FIN}:completed"], None, DEFAULT_CONFIG),
    ("takeover-redelivers-pending-inputs", with_steer_and_follow_up_then_expired,
     lambda h: h.acquire("w2"),
     ["run.lease_granted", "run.input_delivered", "run.input_delivered"], "running",
     DEFAULT_CONFIG),
    # commands that name a run act on that run only
    ("abort-naming-finished-run", leased, naming_old("abort", {}), ["rejected:run_not_active"],
     "running", DEFAULT_CONFIG),
    ("steer-naming-finished-run", leased, naming_old("steer", {"text": "x"}),
     ["rejected:run_not_active"], "running", DEFAULT_CONFIG),
    ("follow_up-naming-finished-run", leased, naming_old("follow_up", {"text": "x"}),
     ["rejected:run_not_active"], "running", DEFAULT_CONFIG),
    ("abort-naming-active-run", leased, lambda h: h.do("abort", {}, run_id=h.last_run),
     ["run.cancel_requested"], "cancelling", DEFAULT_CONFIG),
    ("abort-naming-unknown-run", idle, lambda h: h.do("abort", {}, run_id="r-never"),
     ["rejected:run_not_active"], None, DEFAULT_CONFIG),
    # duplicates compare content
    ("reused-command-id", leased, reused_id, ["rejected:command_id_reused"], "running",
     DEFAULT_CONFIG),
    # retries
    ("retry-of-timed_out", leased, retry_of(lambda h: h.fire("run_deadline")),
     ["run.started:prompt"], "running", DEFAULT_CONFIG),
    ("retry-of-retryable-failure", leased,
     retry_of(lambda h: h.work("run.fail", {"error": "503", "retryable": True})),
     ["run.started:prompt"], "running", DEFAULT_CONFIG),
    ("retry-of-completed", leased, retry_of(lambda h: h.work("run.complete")),
     ["rejected:not_retryable"], None, DEFAULT_CONFIG),
    ("retry-of-unknown-run", idle, lambda h: h.do("prompt", {"text": "x", "retry_of": "r-x"}),
     ["rejected:unknown_run"], None, DEFAULT_CONFIG),
    # steer
    ("running-steer", leased, lambda h: h.steer(), ["run.steered"], "running", DEFAULT_CONFIG),
    ("compacting-steer", compacting, lambda h: h.steer(), ["run.steered"], "compacting",
     DEFAULT_CONFIG),
    ("cancelling-steer", cancelling, lambda h: h.steer(), ["rejected:run_cancelling"],
     "cancelling", DEFAULT_CONFIG),
    ("idle-steer", idle, lambda h: h.steer(), ["rejected:no_active_run"], None, DEFAULT_CONFIG),
    # leases
    ("unclaimed-acquire", running, lambda h: h.acquire("w1"), ["run.lease_granted"], "running",
     DEFAULT_CONFIG),
    ("holder-acquire-again", leased, lambda h: h.acquire("w1"), ["run.lease_renewed"], "running",
     DEFAULT_CONFIG),
    ("other-acquire-held", leased, lambda h: h.acquire("w2"), ["rejected:lease_held"], "running",
     DEFAULT_CONFIG),
    ("cancelling-acquire", cancelling, lambda h: h.acquire("w2"), ["rejected:run_cancelling"],
     "cancelling", DEFAULT_CONFIG),
    ("holder-renew", leased, lambda h: h.work("lease.renew", {"lease_ms": 5_000}),
     ["run.lease_renewed"], "running", DEFAULT_CONFIG),
    ("holder-release", leased, lambda h: h.work("lease.release"), ["run.lease_released"],
     "running", DEFAULT_CONFIG),
    ("running-lease_expiry", leased, lambda h: h.fire("lease_expiry"),
     ["run.lease_expired:lease_expiry"], "running", DEFAULT_CONFIG),
    ("compacting-lease_expiry", compacting, lambda h: h.fire("lease_expiry"),
     ["run.lease_expired:lease_expiry", "run.compaction_abandoned"], "running", DEFAULT_CONFIG),
    ("non-holder-progress", leased,
     lambda h: h.work("run.progress", {"kind": "tool.started"}, worker="w2"),
     ["rejected:not_lease_holder"], "running", DEFAULT_CONFIG),
    ("unclaimed-progress", running, lambda h: h.work("run.progress", {"kind": "tool.started"}),
     ["rejected:not_lease_holder"], "running", DEFAULT_CONFIG),
    ("stale-generation-progress", leased,
     lambda h: h.work("run.progress", {"kind": "tool.started"}, generation=0),
     ["rejected:stale_generation", "run.stale_write_recorded"], "running", DEFAULT_CONFIG),
    ("unknown-run-write", leased,
     lambda h: h.work("run.progress", {"kind": "tool.started"}, run_id="nope"),
     ["rejected:unknown_run"], "running", DEFAULT_CONFIG),
    ("finished-run-write", leased,
     after_complete(lambda h: h.work("run.progress", {"kind": "tool.finished"})),
     ["rejected:run_finished"], None, DEFAULT_CONFIG),
    ("finished-run-stale-write", leased,
     after_complete(lambda h: h.work("run.progress", {"kind": "tool.finished"}, generation=7)),
     ["rejected:stale_generation"], None, DEFAULT_CONFIG),
    ("finished-run-acquire", leased, after_complete(lambda h: h.acquire("w2")),
     ["rejected:run_finished"], None, DEFAULT_CONFIG),
    # timers that no longer apply
    ("timer-lease-renewed", leased, stale_lease_timer, ["rejected:timer_stale"], "running",
     DEFAULT_CONFIG),
    ("timer-older-generation", leased, older_generation_timer, ["rejected:timer_stale"],
     "running", DEFAULT_CONFIG),
    ("timer-deadline-not-reached", leased, deadline_early, ["rejected:timer_stale"], "running",
     DEFAULT_CONFIG),
    ("timer-run-not-active", idle, timer_for_unknown_run, ["rejected:timer_stale"], None,
     DEFAULT_CONFIG),
    # progress
    *[
        (f"progress-{k}", leased, lambda h, k=k: h.work("run.progress", {"kind": k, "name": "x"}),
         [k], "running", DEFAULT_CONFIG)
        for k in ("model.request.started", "model.request.finished", "tool.started",
                  "tool.finished", "subtask.started", "subtask.finished")
    ],
    # action gate
    ("running-action", leased, lambda h: h.work("action.request", REQ), ["action.approved"],
     "running", DEFAULT_CONFIG),
    ("compacting-action", compacting, lambda h: h.work("action.request", REQ), ["action.denied"],
     "compacting", DEFAULT_CONFIG),
    ("cancelling-action", cancelling, lambda h: h.work("action.request", REQ), ["action.denied"],
     "cancelling", DEFAULT_CONFIG),
    ("finished-action", leased, after_complete(lambda h: h.work("action.request", REQ)),
     ["action.denied"], None, DEFAULT_CONFIG),
    ("action-repeated-key", leased, approve_then(lambda h: h.work("action.request", REQ)),
     ["action.decision_replayed:approved"], "running", DEFAULT_CONFIG),
    ("action-too-many-keys", leased,
     approve_then(lambda h: h.work("action.request", {**REQ, "idempotency_key": "k2"})),
     ["action.denied"], "running", ACTIONS1),
    ("action-result", leased, approve_then(lambda h: h.work("action.result", RES)),
     ["action.completed"], "running", DEFAULT_CONFIG),
    ("action-result-unknown", leased, lambda h: h.work("action.result", RES),
     ["rejected:unknown_action"], "running", DEFAULT_CONFIG),
    ("action-result-twice", leased, approve_then(twice(lambda h: h.work("action.result", RES))),
     ["rejected:action_already_completed"], "running", DEFAULT_CONFIG),
    # approvals (docs/protocol.md#approvals)
    ("running-action-needs-approval", leased, lambda h: h.work("action.request", PAY),
     ["action.pending"], "running", APPROVALS),
    ("pending-repeated-key", leased, pending_then(lambda h: h.work("action.request", PAY)),
     ["action.decision_replayed:pending"], "running", APPROVALS),
    ("pending-repeated-other-digest", leased,
     pending_then(lambda h: h.work("action.request", {**PAY, "args_digest": "sha256:bb"})),
     ["action.denied:digest_mismatch"], "running", APPROVALS),
    ("approve-pending", leased, pending_then(lambda h: h.approve()), ["action.approved"],
     "running", APPROVALS),
    ("deny-pending", leased, pending_then(lambda h: h.deny()), ["action.denied:denied"],
     "running", APPROVALS),
    ("approve-unknown-key", leased, lambda h: h.approve("nope"), ["rejected:unknown_action"],
     "running", APPROVALS),
    ("approve-twice", leased, pending_then(twice(lambda h: h.approve())),
     ["rejected:action_not_pending"], "running", APPROVALS),
    ("approve-stale-generation", leased, pending_then(lambda h: h.approve(generation=7)),
     ["rejected:approval_stale"], "running", APPROVALS),
    ("approve-wrong-digest", leased, pending_then(lambda h: h.approve(digest="sha256:bb")),
     ["rejected:digest_mismatch"], "running", APPROVALS),
    ("approve-after-expiry", leased, pending_then(past_the_window(lambda h: h.approve())),
     ["rejected:approval_expired"], "running", APPROVALS),
    ("approve-idle", idle, lambda h: h.approve(run_id="r-gone"), ["rejected:run_not_active"],
     None, APPROVALS),
    ("approval-expiry-timer", leased, pending_then(lambda h: h.fire("approval_expiry")),
     ["action.denied:approval_expired"], "running", APPROVALS),
    ("pending-abort", leased, pending_then(lambda h: h.abort()),
     ["action.denied", "run.cancel_requested"], "cancelling", APPROVALS),
    ("pending-interrupt", leased, pending_then(lambda h: h.prompt("now", "interrupt")),
     ["action.denied", "run.queued", "run.cancel_requested"], "cancelling", APPROVALS),
    ("pending-release", leased, pending_then(lambda h: h.work("lease.release")),
     ["action.denied:lease_lost", "run.lease_released"], "running", APPROVALS),
    ("pending-lease-expiry", leased, pending_then(lambda h: h.fire("lease_expiry")),
     ["action.denied:lease_lost", "run.lease_expired:lease_expiry"], "running", APPROVALS),
    ("pending-complete", leased, pending_then(lambda h: h.work("run.complete")),
     ["action.denied", "run.finished:completed"], None, APPROVALS),
    ("pending-fail", leased, pending_then(lambda h: h.work("run.fail", {"error": "x"})),
     ["action.denied", "run.finished:failed"], None, APPROVALS),
    ("pending-run-deadline", leased, pending_then(lambda h: h.fire("run_deadline")),
     ["action.denied", "run.finished:timed_out"], None,
     DeciderConfig(approval_policy=(("*", "payment"),), default_run_timeout_ms=30_000)),
    # questions to a person (docs/protocol.md#questions-to-a-person)
    ("ask", leased, lambda h: h.ask(), ["question.asked"], "running", QUESTIONS),
    ("ask-again", leased, asked_then(lambda h: h.ask()), ["question.replayed:open"], "running",
     QUESTIONS),
    ("ask-one-too-many", leased, asked_then(lambda h: h.ask("q2")),
     ["question.closed:too_many_questions"], "running", QUESTIONS),
    ("ask-compacting", compacting, lambda h: h.ask(), ["question.closed:compacting"],
     "compacting", QUESTIONS),
    ("ask-cancelling", cancelling, lambda h: h.ask(), ["question.closed:cancelling"],
     "cancelling", QUESTIONS),
    ("answer", leased, asked_then(lambda h: h.answer()), ["question.answered"], "running",
     QUESTIONS),
    ("answer-unknown", leased, lambda h: h.answer("nope"), ["rejected:unknown_question"],
     "running", QUESTIONS),
    ("answer-twice", leased, asked_then(twice(lambda h: h.answer())),
     ["rejected:question_not_open"], "running", QUESTIONS),
    ("answer-stale-generation", leased, asked_then(lambda h: h.answer(generation=7)),
     ["rejected:question_stale"], "running", QUESTIONS),
    ("answer-after-expiry", leased, asked_then(past_the_question(lambda h: h.answer())),
     ["rejected:question_expired"], "running", QUESTIONS),
    ("answer-too-large", leased, asked_then(lambda h: h.answer(answer="x" * 20)),
     ["rejected:answer_too_large"], "running", QUESTIONS),
    ("answer-idle", idle, lambda h: h.answer(run_id="r-gone"), ["rejected:run_not_active"],
     None, QUESTIONS),
    ("question-expiry-timer", leased, asked_then(lambda h: h.fire("approval_expiry")),
     ["question.closed:question_expired"], "running", QUESTIONS),
    ("question-abort", leased, asked_then(lambda h: h.abort()),
     ["question.closed:cancelling", "run.cancel_requested"], "cancelling", QUESTIONS),
    ("question-release", leased, asked_then(lambda h: h.work("lease.release")),
     ["question.closed:lease_lost", "run.lease_released"], "running", QUESTIONS),
    ("question-lease-expiry", leased, asked_then(lambda h: h.fire("lease_expiry")),
     ["question.closed:lease_lost", "run.lease_expired:lease_expiry"], "running", QUESTIONS),
    ("question-complete", leased, asked_then(lambda h: h.work("run.complete")),
     ["question.closed:run_finished", "run.finished:completed"], None, QUESTIONS),
    ("question-and-approval-fail", leased,
     pending_then(asked_then(lambda h: h.work("run.fail", {"error": "x"}))),
     ["action.denied", "question.closed:run_finished", "run.finished:failed"], None,
     DeciderConfig(approval_policy=(("*", "payment"),))),
    # queue control (docs/protocol.md#queue-control)
    ("dequeue-waiting", running, lambda h: (h.prompt("b", "enqueue", command_id="B"),
                                            h.dequeue("B"))[1],
     ["run.dequeued:dequeued"], "running", DEFAULT_CONFIG),
    ("dequeue-not-queued", running, lambda h: h.dequeue("nobody"), ["rejected:not_queued"],
     "running", DEFAULT_CONFIG),
    ("clear_queue", running, lambda h: (h.prompt("b", "enqueue"), h.prompt("c", "enqueue"),
                                        h.clear_queue())[2],
     ["run.dequeued:cleared", "run.dequeued:cleared"], "running", DEFAULT_CONFIG),
    ("clear_queue-empty", running, lambda h: h.clear_queue(), ["rejected:queue_empty"],
     "running", DEFAULT_CONFIG),
    # tenancy and size
    ("tenant-mismatch", leased, lambda h: h.prompt(tenant="evil"), ["rejected:tenant_mismatch"],
     "running", DEFAULT_CONFIG),
    ("payload-too-large", idle, lambda h: h.prompt("x" * 128), ["rejected:payload_too_large"],
     None, SMALL),
    # the topic a command arrives on says who wrote it: the wrong class is refused, nothing
    # else happens (the run goes on, no lease moves, no timer fires)
    ("producer-topic-run.complete", leased, on("producer", lambda h: h.work("run.complete")),
     ["rejected:not_allowed_here"], "running", DEFAULT_CONFIG),
    ("producer-topic-timer", leased, on("producer", lambda h: h.fire("run_deadline")),
     ["rejected:not_allowed_here"], "running", DEFAULT_CONFIG),
    ("worker-topic-timer", cancelling, on("worker", lambda h: h.fire("cancel_deadline")),
     ["rejected:not_allowed_here"], "cancelling", DEFAULT_CONFIG),
    ("worker-topic-prompt", idle, on("worker", lambda h: h.prompt()),
     ["rejected:not_allowed_here"], None, DEFAULT_CONFIG),
    ("worker-topic-abort", leased, on("worker", lambda h: h.abort()),
     ["rejected:not_allowed_here"], "running", DEFAULT_CONFIG),
    ("timer-topic-lease.acquire", running, on("timer", lambda h: h.acquire("w9")),
     ["rejected:not_allowed_here"], "running", DEFAULT_CONFIG),
    ("producer-topic-prompt", idle, on("producer", lambda h: h.prompt()),
     ["run.started:prompt"], "running", DEFAULT_CONFIG),
    ("worker-topic-lease.acquire", running, on("worker", lambda h: h.acquire("w1")),
     ["run.lease_granted"], "running", DEFAULT_CONFIG),
    ("timer-topic-run_deadline", leased, on("timer", lambda h: h.fire("run_deadline")),
     [f"{FIN}:timed_out"], None, DEFAULT_CONFIG),
    # schedules (docs/protocol.md#schedules)
    ("idle-schedule.create", idle, lambda h: h.schedule(), ["schedule.created"], None,
     DEFAULT_CONFIG),
    ("running-schedule.create", running, lambda h: h.schedule(), ["schedule.created"], "running",
     DEFAULT_CONFIG),
    ("schedule.create-twice", idle, lambda h: (h.schedule(), h.schedule())[-1],
     ["rejected:schedule_exists"], None, DEFAULT_CONFIG),
    ("schedule.create-too-many", idle, lambda h: (h.schedule("a"), h.schedule("b"))[-1],
     ["rejected:too_many_schedules"], None, SCHEDULES1),
    ("schedule.create-bad-cron", idle, lambda h: h.schedule(cron="61 * * * *"),
     ["rejected:invalid_schedule"], None, DEFAULT_CONFIG),
    ("schedule.update-unknown", idle, lambda h: h.update_schedule("nope"),
     ["rejected:unknown_schedule"], None, DEFAULT_CONFIG),
    ("schedule.update", idle, lambda h: (h.schedule(), h.update_schedule(interval_ms=120_000))[-1],
     ["schedule.updated"], None, DEFAULT_CONFIG),
    ("schedule.delete", idle, lambda h: (h.schedule(), h.delete_schedule())[-1],
     ["schedule.deleted"], None, DEFAULT_CONFIG),
    ("idle-schedule-fires", idle, lambda h: (h.schedule(), h.fire("schedule"))[-1],
     ["schedule.fired", "run.started:prompt"], "running", DEFAULT_CONFIG),
    ("running-schedule-skip", running, lambda h: (h.schedule(), h.fire("schedule"))[-1],
     ["schedule.fired"], "running", DEFAULT_CONFIG),
    ("running-schedule-reject", running,
     lambda h: (h.schedule(overlap="reject"), h.fire("schedule"))[-1],
     ["schedule.fired", "rejected:session_busy"], "running", DEFAULT_CONFIG),
    ("running-schedule-enqueue", running,
     lambda h: (h.schedule(overlap="enqueue"), h.fire("schedule"))[-1],
     ["schedule.fired", "run.queued"], "running", DEFAULT_CONFIG),
    ("leased-schedule-interrupt", leased,
     lambda h: (h.schedule(overlap="interrupt"), h.fire("schedule"))[-1],
     ["schedule.fired", "run.queued", "run.cancel_requested"], "cancelling", DEFAULT_CONFIG),
    ("schedule-timer-after-delete", idle, schedule_timer_after_delete, ["rejected:timer_stale"],
     None, DEFAULT_CONFIG),
]
# fmt: on


@pytest.mark.parametrize(
    ("arrange", "act", "expected", "status", "config"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_transition(
    arrange: Callable[[Harness], None],
    act: Act,
    expected: list[str],
    status: str | None,
    config: DeciderConfig,
) -> None:
    h = Harness(config)
    arrange(h)
    events = act(h)
    assert tokens(events) == expected
    assert h.status == status
    for e in events:
        assert e.command_id == h.commands[-1].command_id
        if e.type == "command.rejected":
            assert e.run_id == "_session"


def test_every_rejection_reason_has_a_row() -> None:
    """A new reason in the decider without a row here fails this test."""
    produced = {
        m.group(1) for c in CASES for t in c[3] if (m := re.fullmatch(r"rejected:(\w+)", t))
    }
    assert produced == REJECTION_REASONS


def test_case_ids_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
