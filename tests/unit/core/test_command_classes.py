"""Who may write which command: the topic a command arrives on decides its class.

The table below is written from the spec (docs/protocol.md "Command topics"), not
from `sessionstream.schemas.commands`: producers write `session.commands`, workers write
`session.worker-commands`, and only the processor and administrators write
`session.timers` (the control topic: timers and `session.erase`). A command of
another class on a topic is rejected `not_allowed_here` with no other effect, in any state
a session is in, and does not use up its command id.
"""

from __future__ import annotations

import pytest

from sessionstream.core.decider import decide
from sessionstream.core.state import SessionState
from sessionstream.schemas.commands import COMMAND_CLASSES, Command, command_class
from tests.unit._harness import Harness, cancelling, compacting, idle, leased, running
from tests.unit._samples import COMMAND_TYPES, command

SPEC: dict[str, set[str]] = {
    "producer": {
        "prompt",
        "steer",
        "follow_up",
        "send",
        "abort",
        "action.approve",
        "action.deny",
        "question.answer",
        "schedule.create",
        "schedule.update",
        "schedule.delete",
        "dequeue",
        "clear_queue",
    },
    "worker": {
        "lease.acquire",
        "lease.renew",
        "lease.release",
        "run.progress",
        "compact.start",
        "compact.finish",
        "action.request",
        "action.result",
        "question.ask",
        "cancel.ack",
        "run.complete",
        "run.fail",
        "step.record",
    },
    # the control topic: the processor's timers and an administrator's erasure
    "timer": {"timer.fired", "session.erase"},
}
ARRANGE = {
    "idle": idle,
    "running": running,
    "leased": leased,
    "compacting": compacting,
    "cancelling": cancelling,
}


def test_every_command_type_has_exactly_one_class() -> None:
    assert {k: set(v) for k, v in COMMAND_CLASSES.items()} == SPEC
    assert sorted(set().union(*SPEC.values())) == COMMAND_TYPES
    for via, types in SPEC.items():
        for t in types:
            assert command_class(t) == via


def _in(h: Harness, type_: str) -> Command:
    """A command of `type_` for `h`'s session, addressed to its active run at its generation."""
    c = command(type_)
    run = h.state.active
    fields = {"session_id": h.session_id, "tenant_id": h.tenant, "ts": h.now, "command_id": "x1"}
    if run is not None and c.run_id is not None:
        fields |= {"run_id": run.run_id, "generation": run.generation, "worker_id": "w1"}
    return c.model_copy(update=fields)


@pytest.mark.parametrize("arrange", sorted(ARRANGE))
@pytest.mark.parametrize("via", sorted(SPEC))
@pytest.mark.parametrize("type_", COMMAND_TYPES)
def test_a_command_of_another_class_is_refused_and_changes_nothing(
    type_: str, via: str, arrange: str
) -> None:
    h = Harness()
    ARRANGE[arrange](h)
    before = h.state
    cmd = _in(h, type_)
    d = decide(before, cmd, h.config, at=h.now, via=via)  # type: ignore[arg-type]
    refused = [e for e in d.events if e.type == "command.rejected"]
    if type_ in SPEC[via]:
        assert all(e.payload.reason != "not_allowed_here" for e in refused)  # type: ignore[attr-defined]
        return
    assert [(e.type, e.payload.reason) for e in d.events] == [  # type: ignore[attr-defined]
        ("command.rejected", "not_allowed_here")
    ]
    assert d.remember is None  # the id is not used up
    # only the session log's sequence moved: the run, its lease, generation, queue and
    # tenant binding are as they were
    assert d.state.active == before.active
    assert d.state.tenant_id == before.tenant_id
    assert d.state.queue == before.queue


def test_the_id_of_a_refused_command_still_works_on_its_own_topic() -> None:
    h = Harness()
    h.via = "worker"
    assert [e.type for e in h.do("prompt", {"text": "p"}, command_id="same")] == [
        "command.rejected"
    ]
    h.via = "producer"
    assert [e.type for e in h.do("prompt", {"text": "p"}, command_id="same")] == ["run.started"]


def test_a_refused_command_of_another_tenant_does_not_bind_the_session() -> None:
    h = Harness()
    h.via = "worker"
    h.do("prompt", {"text": "p"}, tenant="evil")
    assert h.state.tenant_id is None
    h.via = "producer"
    assert [e.type for e in h.prompt()] == ["run.started"]
    assert h.state.tenant_id == h.tenant


def test_without_a_topic_every_class_is_decided() -> None:
    """Tools and the stateful tests decide without a topic (via=None): no class check."""
    d = decide(
        SessionState.initial("s"), command("timer.fired").model_copy(update={"session_id": "s"})
    )
    assert all(getattr(e.payload, "reason", None) != "not_allowed_here" for e in d.events)
