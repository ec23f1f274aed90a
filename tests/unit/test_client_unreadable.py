"""An event the SDK cannot read (a newer processor's, or bytes that are no event) on the
outcome tail: it is skipped and the tail goes on; only the tracked commands of its session
whose outcome may start at or before it are told `IncompatibleEvent` — they cannot know
their outcome — and every other command is unaffected. (It used to raise out of the tail
for whatever command was being waited for, and killed the gateway's commands thread.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from schemas.codec import Codec
from schemas.commands import AbortPayload, Command
from sessionstream.client import CommandHandle, SessionClient, _key, _Round
from sessionstream.errors import IncompatibleEvent
from sessionstream.settings import Settings


def _msg(key: bytes, offset: int, value: bytes) -> Any:
    return SimpleNamespace(
        error=lambda: None,
        key=lambda: key,
        value=lambda: value,
        offset=lambda: offset,
        partition=lambda: 0,
        topic=lambda: "session.events",
    )


def _tracked(c: SessionClient, session: str, start: int) -> CommandHandle:
    cmd = Command(
        command_id=f"c-{session}-{start}",
        session_id=session,
        tenant_id="t",
        type="abort",
        ts=1,
        payload=AbortPayload(),
    )
    h = CommandHandle(cmd, events_from={0: start})
    c._pending[_key(h)] = []
    c._pending_from[_key(h)] = (start, cmd.ts)
    return h


def test_an_unreadable_event_marks_only_its_sessions_commands_from_before_it() -> None:
    c = SessionClient("t", Settings(), codec=Codec())
    before = _tracked(c, "s1", 10)  # its outcome may start before the unreadable event
    after = _tracked(c, "s1", 60)  # sent after it: the event is not its
    other = _tracked(c, "s2", 10)  # another session on the same partition
    for garbage in (b"", b"\x00\x01garbage", b"\xff" * 40):
        c._drain_one(_msg(b"s1/r1/0000000001", 50, garbage))  # skipped, no raise
    rnd = _Round(c)
    with pytest.raises(IncompatibleEvent, match=r"session.events\[0\]@50"):
        c._step(before, rnd)
    assert c._step(after, rnd) is None  # not acknowledged yet: still waiting, no error
    assert c._step(other, rnd) is None
    c.release(before)
    assert _key(before) not in c._unreadable


def test_an_unreadable_event_without_a_session_key_affects_no_command() -> None:
    c = SessionClient("t", Settings(), codec=Codec())
    h = _tracked(c, "s1", 0)
    c._drain_one(_msg(b"", 5, b"junk"))
    assert c._step(h, _Round(c)) is None
