"""The commands a producer sends by name: `SessionClient.prompt`, `steer`, `follow_up`,
`send`, `abort`, `approve`, `deny`, `answer`, `dequeue`, `clear_queue`, a session's schedules
(`schedule_create`, `schedule_update`, `schedule_delete`), and an administrator's `erase`.
Each builds its payload, names the run it acts on (`KNOWN_RUN`: the one the client last saw
active in the session; a decision names its run always) and hands the command to
`SessionClient.submit`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

from sessionstream.schemas._json import jsonable
from sessionstream.schemas.commands import (
    AbortPayload,
    ActionApprovePayload,
    ActionDenyPayload,
    ClearQueuePayload,
    Command,
    DequeuePayload,
    FollowUpPayload,
    PromptPayload,
    PromptPolicy,
    ScheduleCreatePayload,
    ScheduleDeletePayload,
    ScheduleUpdatePayload,
    SendPayload,
    SessionErasePayload,
    SteerPayload,
)
from sessionstream.schemas.questions import QuestionAnswerPayload

if TYPE_CHECKING:
    from sessionstream._outcomes import CommandHandle

__all__ = ["KNOWN_RUN", "ProducerCommands"]


class _KnownRun:
    """`run_id` default: the run this client last saw active in the session (none known:
    session-scoped)."""

    def __repr__(self) -> str:
        return "KNOWN_RUN"


KNOWN_RUN: Final = _KnownRun()


class ProducerCommands:
    """The named producer commands; `SessionClient` provides `command`, `submit` and
    `_target`."""

    def command(self, session_id: str, type_: str, payload: Any, **fields: Any) -> Command:
        raise NotImplementedError

    def submit(self, command: Command, *, track: bool = True) -> CommandHandle:
        raise NotImplementedError

    def _target(self, session_id: str, run_id: str | _KnownRun | None) -> str | None:
        raise NotImplementedError

    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        policy: PromptPolicy = "reject",
        context_ref: str | None = None,
        timeout_ms: int | None = None,
        retry_of: str | None = None,
        input: Any = None,
        metadata: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> CommandHandle:
        """A new task in `session_id`. `input` is its typed input: any JSON value, or a
        pydantic model or dataclass (sent as its JSON); the worker validates it against the
        type its handler declares (docs/workers.md#typed-input). `metadata` labels its run
        (≤ 16 keys of 1-64 chars of `A-Za-z0-9._/-`, values ≤ 256 chars; `ValueError`
        beyond), what run search filters on. With `policy="enqueue"` the task it queues is
        named by this command's id: `dequeue(session_id, handle.command.command_id)`."""
        payload = PromptPayload(
            text=text,
            policy=policy,
            context_ref=context_ref,
            timeout_ms=timeout_ms,
            retry_of=retry_of,
            input=jsonable(input),
            metadata=dict(metadata) if metadata else None,
        )
        return self.submit(self.command(session_id, "prompt", payload, **fields))

    def steer(
        self,
        session_id: str,
        text: str,
        *,
        run_id: str | _KnownRun | None = KNOWN_RUN,
        **fields: Any,
    ) -> CommandHandle:
        run = self._target(session_id, run_id)
        cmd = self.command(session_id, "steer", SteerPayload(text=text), run_id=run, **fields)
        return self.submit(cmd)

    def follow_up(
        self,
        session_id: str,
        text: str,
        *,
        when_idle: Literal["start", "reject"] = "start",
        on_run_end: Literal["drop", "queue"] = "drop",
        run_id: str | _KnownRun | None = KNOWN_RUN,
        **fields: Any,
    ) -> CommandHandle:
        payload = FollowUpPayload(text=text, when_idle=when_idle, on_run_end=on_run_end)
        run = self._target(session_id, run_id)
        return self.submit(self.command(session_id, "follow_up", payload, run_id=run, **fields))

    def send(
        self,
        session_id: str,
        text: str,
        *,
        context_ref: str | None = None,
        timeout_ms: int | None = None,
        **fields: Any,
    ) -> CommandHandle:
        payload = SendPayload(text=text, context_ref=context_ref, timeout_ms=timeout_ms)
        return self.submit(self.command(session_id, "send", payload, **fields))

    def abort(
        self,
        session_id: str,
        reason: str = "user",
        *,
        run_id: str | _KnownRun | None = KNOWN_RUN,
        **fields: Any,
    ) -> CommandHandle:
        run = self._target(session_id, run_id)
        payload = AbortPayload(reason=reason)
        return self.submit(self.command(session_id, "abort", payload, run_id=run, **fields))

    def approve(
        self,
        session_id: str,
        run_id: str,
        key: str,
        *,
        args_digest: str | None,
        generation: int | None = None,
        **fields: Any,
    ) -> CommandHandle:
        """A person (the client's `actor`, recorded as `decidedBy`) approves the pending
        action `key` of run `run_id`: `args_digest` is the digest they were shown,
        `generation` (optional) the request's. `wait()` answers accepted
        (`action.approved`) or rejected with the reason (`action_not_pending`,
        `digest_mismatch`, `approval_stale`, `approval_expired`, `unknown_action`,
        `run_not_active`; docs/protocol.md#approvals)."""
        payload = ActionApprovePayload(
            idempotency_key=key, args_digest=args_digest, generation=generation
        )
        cmd = self.command(session_id, "action.approve", payload, run_id=run_id, **fields)
        return self.submit(cmd)

    def deny(
        self,
        session_id: str,
        run_id: str,
        key: str,
        *,
        args_digest: str | None,
        reason: str | None = None,
        generation: int | None = None,
        **fields: Any,
    ) -> CommandHandle:
        """A person denies the pending action `key` of run `run_id`; `reason` is theirs
        (`action.denied {reason: denied, detail: reason, decidedBy}`). The same rejections
        as `approve`."""
        payload = ActionDenyPayload(
            idempotency_key=key, args_digest=args_digest, generation=generation, reason=reason
        )
        cmd = self.command(session_id, "action.deny", payload, run_id=run_id, **fields)
        return self.submit(cmd)

    def answer(
        self,
        session_id: str,
        run_id: str,
        question_id: str,
        answer: Any,
        *,
        generation: int | None = None,
        **fields: Any,
    ) -> CommandHandle:
        """A person (the client's `actor`, recorded as `answeredBy`) answers the open
        question `question_id` of run `run_id` (`ctx.ask_user` in the run's handler) with
        any JSON value; `generation` (optional) the question's. `wait()` answers accepted
        (`question.answered`) or rejected with the reason (`unknown_question`,
        `question_not_open`, `question_stale`, `question_expired`, `answer_too_large`,
        `run_not_active`; docs/protocol.md#questions-to-a-person)."""
        payload = QuestionAnswerPayload(
            question_id=question_id, answer=jsonable(answer), generation=generation
        )
        cmd = self.command(session_id, "question.answer", payload, run_id=run_id, **fields)
        return self.submit(cmd)

    def dequeue(self, session_id: str, task: str | CommandHandle, **fields: Any) -> CommandHandle:
        """Remove a waiting task from the session's queue: `task` is the id of the command
        that queued it (or that command's handle). Its outcome is `run.dequeued`, or a
        rejection `not_queued` whose `targetStatus` says what became of the task."""
        command_id = task if isinstance(task, str) else task.command.command_id
        payload = DequeuePayload(command_id=command_id)
        return self.submit(self.command(session_id, "dequeue", payload, **fields))

    def clear_queue(self, session_id: str, **fields: Any) -> CommandHandle:
        """Remove every waiting task: one `run.dequeued {reason: cleared}` each, or the
        rejection `queue_empty`."""
        payload = ClearQueuePayload()
        return self.submit(self.command(session_id, "clear_queue", payload, **fields))

    def erase(self, session_id: str, reason: str | None = None, **fields: Any) -> CommandHandle:
        """An administrator's `session.erase` (docs/protocol.md, erasure and retention): it
        goes to the control topic, which only administrators' credentials may write; the
        outcome is `session.erased`, or `session_busy` while a run is active."""
        payload = SessionErasePayload(reason=reason)
        return self.submit(self.command(session_id, "session.erase", payload, **fields))

    def schedule_create(
        self, session_id: str, schedule_id: str, text: str, **definition: Any
    ) -> CommandHandle:
        """A schedule in `session_id`: `text` sent as a prompt on `cron` (read in
        `timezone`) or every `interval_ms`; `overlap`, `catch_up`, `max_catch_up`,
        `jitter_ms`, `input`, `timeout_ms`, `context_ref` as docs/protocol.md#schedules
        says. The decider checks the definition: a bad one is rejected `invalid_schedule`."""
        fields = {k: definition.pop(k) for k in ("command_id", "run_id") if k in definition}
        if "input" in definition:
            definition["input"] = jsonable(definition["input"])
        payload = ScheduleCreatePayload(schedule_id=schedule_id, text=text, **definition)
        return self.submit(self.command(session_id, "schedule.create", payload, **fields))

    def schedule_update(
        self, session_id: str, schedule_id: str, text: str, **definition: Any
    ) -> CommandHandle:
        """Replace the schedule's whole definition (as `schedule_create` takes it)."""
        fields = {k: definition.pop(k) for k in ("command_id", "run_id") if k in definition}
        if "input" in definition:
            definition["input"] = jsonable(definition["input"])
        payload = ScheduleUpdatePayload(schedule_id=schedule_id, text=text, **definition)
        return self.submit(self.command(session_id, "schedule.update", payload, **fields))

    def schedule_delete(self, session_id: str, schedule_id: str, **fields: Any) -> CommandHandle:
        """Delete the schedule; a firing already on its way is refused `timer_stale`."""
        payload = ScheduleDeletePayload(schedule_id=schedule_id)
        return self.submit(self.command(session_id, "schedule.delete", payload, **fields))
