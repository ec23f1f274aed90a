"""How `SessionClient` reads a command's outcome off `session.outcomes`: the
processor's outcome record decides it, matched by session, command id and the command's
`ts` after where the partition ended when it was sent; an accepted or rejected command is
answered once all of its events are read. A record this version cannot read is skipped;
only the tracked commands of its session that it may belong to raise `IncompatibleEvent`.
The broker is stood in for by messages handed to `_drain_one` (the integration tests read
real ones)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sessionstream._outcomes import command_key as _key
from sessionstream.client import CommandHandle, SessionClient
from sessionstream.errors import IncompatibleEvent
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import AbortPayload, Command
from sessionstream.schemas.outcomes import CommandOutcome
from sessionstream.settings import Settings
from tests.unit._samples import event
from tests.unit.schemas.test_codec_confluent import _registry

S = Settings()
OUT, EV = S.outcomes_topic, S.events_topic


def _msg(topic: str, key: bytes, offset: int, value: bytes, partition: int = 0) -> Any:
    return SimpleNamespace(
        error=lambda: None,
        key=lambda: key,
        value=lambda: value,
        offset=lambda: offset,
        partition=lambda: partition,
        topic=lambda: topic,
    )


def _client() -> SessionClient:
    return SessionClient("t", S, codec=Codec(schemas=_registry_with_outcome()))


def _registry_with_outcome() -> Any:
    from sessionstream.schemas._avro import outcome_schema

    reg = _registry()
    reg.ids["outcome"] = 11
    reg.schemas[11] = outcome_schema()
    return reg


def _tracked(c: SessionClient, session: str, start: int, ts: int = 1) -> CommandHandle:
    cmd = Command(
        command_id=f"c-{session}-{start}",
        session_id=session,
        tenant_id="t",
        type="abort",
        ts=ts,
        payload=AbortPayload(),
    )
    h = CommandHandle(cmd, events_from={0: start}, outcomes_from={0: start})
    # acknowledged: the outcomes below name this record (commands topic, 0, offset 5)
    h.acked, h.partition, h.offset, h.topic = True, 0, 5, S.commands_topic
    c._matcher.track(h)
    return h


def _outcome(h: CommandHandle, status: str, **fields: Any) -> bytes:
    c = h.command
    o = CommandOutcome(
        command_id=c.command_id,
        session_id=c.session_id,
        tenant_id=c.tenant_id,
        command_type=c.type,
        status=status,  # type: ignore[arg-type]
        source_topic=S.commands_topic,
        source_partition=0,
        source_offset=5,
        producer_ts=fields.pop("producer_ts", c.ts),
        ts=9,
        **fields,
    )
    return Codec(schemas=_registry_with_outcome()).encode_outcome(o)


def _event_of(h: CommandHandle, type_: str, seq: int) -> bytes:
    e = event(type_).model_copy(
        update={
            "session_id": h.command.session_id,
            "command_id": h.command.command_id,
            "producer_ts": h.command.ts,
            "seq": seq,
        }
    )
    return Codec(schemas=_registry_with_outcome()).encode_event(e)


def test_an_accepted_command_is_answered_once_its_outcome_and_all_its_events_are_read() -> None:
    c = _client()
    h = _tracked(c, "s1", 10)
    c._drain_one(
        _msg(OUT, b"s1/x", 12, _outcome(h, "accepted", run_id="r1", event_count=2,
                                         first_event_offset=20, last_event_offset=21))
    )  # fmt: skip
    c._tail_position = lambda topic, p: 20  # type: ignore[method-assign]
    assert c._step(h) is None, "its events are not all read yet"
    c._drain_one(_msg(EV, b"s1/r1/1", 20, _event_of(h, "run.cancel_requested", 1)))
    c._drain_one(_msg(EV, b"s1/r1/2", 21, _event_of(h, "run.finished", 2)))
    got = c._step(h)
    assert got is not None and got.status == "accepted" and got.run_id == "r1"
    assert [e.type for e in got.events] == ["run.cancel_requested", "run.finished"]


@pytest.mark.parametrize(
    ("status", "fields", "expected"),
    [
        ("duplicate", {"first_decided_at": 3}, ("duplicate", None)),
        ("dead_letter", {"reason": "oversized"}, ("dead_letter", "oversized")),
        ("rejected", {"reason": "session_busy", "event_count": 0}, ("rejected", "session_busy")),
    ],
)
def test_each_outcome_status_is_the_commands_answer(
    status: str, fields: dict[str, Any], expected: tuple[str, str | None]
) -> None:
    c = _client()
    h = _tracked(c, "s1", 0)
    c._drain_one(_msg(OUT, b"k", 3, _outcome(h, status, **fields)))
    got = c._step(h)
    assert got is not None and (got.status, got.reason) == expected


def test_another_send_of_the_same_id_or_an_earlier_outcome_is_not_taken() -> None:
    c = _client()
    h = _tracked(c, "s1", 10, ts=7)
    c._drain_one(_msg(OUT, b"k", 11, _outcome(h, "accepted", producer_ts=6)))  # another ts
    c._drain_one(_msg(OUT, b"k", 9, _outcome(h, "duplicate")))  # before the start
    c._drain_one(_msg(OUT, b"k", 12, _outcome(h, "forwarded", forwarded_to=2)))  # moved on
    assert c._step(h) is None
    c._drain_one(_msg(OUT, b"k", 13, _outcome(h, "duplicate")))
    assert c._step(h) is not None


def test_a_dead_letter_without_a_command_id_is_found_by_where_the_record_was() -> None:
    c = _client()
    h = _tracked(c, "s1", 0)
    dead = CommandOutcome(
        session_id="s1",
        status="dead_letter",
        reason="malformed",
        source_topic=S.commands_topic,
        source_partition=0,
        source_offset=5,
        ts=9,
    )
    raw = Codec(schemas=_registry_with_outcome()).encode_outcome(dead)
    c._drain_one(_msg(OUT, b"s1/@0:5", 3, raw))
    got = c._step(h)
    assert got is not None and (got.status, got.reason) == ("dead_letter", "malformed")


def test_an_unreadable_record_marks_only_its_sessions_commands_from_before_it() -> None:
    c = _client()
    before = _tracked(c, "s1", 10)  # its outcome may start before the unreadable record
    after = _tracked(c, "s1", 60)  # sent after it: the record is not its
    other = _tracked(c, "s2", 10)  # another session on the same partition
    for garbage in (b"", b"\x01garbage", b"\xff" * 40):
        c._drain_one(_msg(OUT, b"s1/c", 50, garbage))  # skipped, no raise
    with pytest.raises(IncompatibleEvent, match=rf"{OUT}\[0\]@50"):
        c._step(before)
    assert c._step(after) is None
    assert c._step(other) is None
    c.release(before)
    assert _key(before) not in c._matcher._unreadable


def test_a_dead_letter_of_another_record_with_the_same_command_is_not_ours() -> None:
    """The same bytes under another key (a key mismatch) are another record: its dead
    letter carries our session and id, but not our place; our own decision is taken."""
    c = _client()
    h = _tracked(c, "s1", 0)
    c._drain_one(_msg(OUT, b"k", 1, _outcome(h, "dead_letter", reason="key_mismatch")))
    read = c._matcher._outcomes[_key(h)]
    read[0] = read[0].model_copy(update={"source_offset": 4})
    assert c._step(h) is None, "another record's dead letter"
    c._drain_one(_msg(OUT, b"k", 2, _outcome(h, "duplicate", first_decided_at=1)))
    got = c._step(h)
    assert got is not None and got.status == "duplicate"
    waiting = _tracked(c, "s2", 0)
    waiting.acked = False
    c._drain_one(_msg(OUT, b"k", 3, _outcome(waiting, "duplicate")))
    assert c._step(waiting) is None, "not before its own delivery report"


def test_an_unreadable_event_without_a_session_key_affects_no_command() -> None:
    c = _client()
    h = _tracked(c, "s1", 0)
    c._drain_one(_msg(EV, b"", 5, b"junk"))
    assert c._step(h) is None
