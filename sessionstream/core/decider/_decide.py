"""`decide(state, command) -> Decision`: the order of the checks, and which rule each
command type gets."""

from __future__ import annotations

from typing import Final

from sessionstream.core.decider._actions import _decide_action
from sessionstream.core.decider._base import DEFAULT_CONFIG, DeciderConfig, Decision, command_digest
from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.decider._erase import _erase
from sessionstream.core.decider._producer import _abort, _follow_up, _prompt, _send, _steer
from sessionstream.core.decider._questions import _question_answer
from sessionstream.core.decider._queue import _clear_queue, _dequeue
from sessionstream.core.decider._schedules import _define, _delete
from sessionstream.core.decider._timers import _timer
from sessionstream.core.decider._worker import _WORKER_HANDLERS, _worker
from sessionstream.core.state import (
    SessionState,
)
from sessionstream.schemas.commands import (
    COMMAND_CLASSES,
    PRODUCER_COMMAND_TYPES,
    Command,
    CommandClass,
)
from sessionstream.schemas.events import (
    Event,
)


def decide(
    state: SessionState | None,
    command: Command,
    config: DeciderConfig = DEFAULT_CONFIG,
    *,
    at: int | None = None,
    seen: tuple[int, int] | None = None,
    via: CommandClass | None = None,
) -> Decision:
    """Decide `command` in `state`.

    `at` is the broker's append time of the command record (the processor always passes
    it; tests and tools that have no log fall back to the command's `ts`). `seen` is what
    the caller's dedup store holds for this command id: (content digest, decided at), or
    None. A record older than `dedup_ttl_ms` is not looked at. Whatever `Decision.remember`
    says is to be stored as (`remember`, `Decision.state.clock`). `via` is the class of
    the topic the command arrived on (None: tools and tests that have no topic); a command
    of another class is rejected `not_allowed_here` and changes nothing else.
    """
    if state is None:
        state = SessionState.initial(command.session_id)
    if state.session_id != command.session_id:
        raise ValueError(f"command for {command.session_id} given state of {state.session_id}")
    now = max(state.clock, command.ts if at is None else at)
    em = _Emitter(state, command, config, now)
    # Step 1: authorization, before anything is remembered of the command: a command on
    # a topic its writer may not use (a producer's lease, anyone's timer) and a foreign
    # tenant's command must never take an id from the session's owner
    if via is not None and command.type not in COMMAND_CLASSES[via]:
        em.reject("not_allowed_here", f"{command.type} is not a {via} command")
        return Decision(em.events, em.state, None)
    if state.tenant_id is not None and command.tenant_id != state.tenant_id:
        em.reject(
            "tenant_mismatch", f"session belongs to another tenant than {command.tenant_id!r}"
        )
        return Decision(em.events, em.state, None)
    # Step 2: duplicates compare content: an exact re-send decides nothing, another
    # command under a used id is refused (the id keeps its first meaning)
    payload_json = command.payload.__pydantic_serializer__.to_json(command.payload)
    digest = command_digest(command, payload_json)
    if seen is not None and now - seen[1] <= config.dedup_ttl_ms:
        if seen[0] == digest:
            return Decision([], state, None)
        em.reject("command_id_reused", "this commandId was used before for another command")
        return Decision(em.events, em.state, None)
    # Step 3: size, then the command's own rules
    if len(payload_json) > config.max_payload_bytes:
        em.reject("payload_too_large", f"{len(payload_json)} bytes > {config.max_payload_bytes}")
    elif command.type in PRODUCER_COMMAND_TYPES and not _names_active_run(em):
        pass
    else:
        handler = _HANDLERS.get(command.type)
        if handler is not None:
            handler(em, command)
        else:
            _worker(em, command)
    remember: int | None = digest
    if command.type == "timer.fired" and em.events[0].type == "command.rejected":
        remember = None  # a timer that was not due (yet) may come again and decide then
    elif em.events and em.events[-1].type == "session.erased":
        remember = None  # an erasure leaves no record of the session, not even its own id
    return Decision(em.events, em.state, remember)


def apply(
    state: SessionState | None,
    command: Command,
    config: DeciderConfig = DEFAULT_CONFIG,
    *,
    at: int | None = None,
    seen: tuple[int, int] | None = None,
    via: CommandClass | None = None,
) -> tuple[list[Event], SessionState]:
    """`decide`, as (events, state after them)."""
    d = decide(state, command, config, at=at, seen=seen, via=via)
    return d.events, d.state


def _names_active_run(em: _Emitter) -> bool:
    """A producer command naming a run acts on that run only; False (and rejected) if that
    run is not the active one."""
    target = em.cmd.run_id
    run = em.state.active
    if target is None or (run is not None and run.run_id == target):
        return True
    done = em.state.finished_run(target)
    status = done.status if done is not None else None
    what = f"has finished: {status}" if status else "is not a run of this session we know"
    em.reject("run_not_active", f"run {target} {what}", target_status=status or "unknown")
    return False


_HANDLERS = {
    "prompt": _prompt,
    "send": _send,
    "steer": _steer,
    "follow_up": _follow_up,
    "abort": _abort,
    "action.approve": _decide_action,
    "action.deny": _decide_action,
    "question.answer": _question_answer,
    "dequeue": _dequeue,
    "clear_queue": _clear_queue,
    "timer.fired": _timer,
    "session.erase": _erase,
    "schedule.create": _define,
    "schedule.update": _define,
    "schedule.delete": _delete,
}

#: every command type with an explicit rule (`lease.acquire` is decided by `_worker` itself)
HANDLED_COMMAND_TYPES: Final = (
    frozenset(_HANDLERS) | frozenset(_WORKER_HANDLERS) | {"lease.acquire"}
)
