"""`SessionClient` calls made with ``wait=False`` (what the gateway's event loop makes): they
never wait on Kafka or the registry, and what they cannot do without waiting is neither
done halfway nor lost — `submit_many` sends nothing and raises `WouldWait`; a drain stops
at the first record whose schema must be asked for and holds it, with everything after
it, for a drain that may wait. The broker is stood in for by messages handed to the drain
(the gateway's integration tests read real ones)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sessionstream.client import CommandHandle, SessionClient, WouldWait
from sessionstream.schemas._avro import event_schema
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import AbortPayload, Command
from tests.unit._samples import event
from tests.unit.test_client_unreadable import (
    EV,
    OUT,
    S,
    _event_of,
    _msg,
    _outcome,
    _registry_with_outcome,
    _tracked,
)

#: a registry id this client has not met, of the same event schema as its own (a second
#: subject, or a registry that gives one schema two ids)
OTHER_ID = 12


def _registry() -> Any:
    reg = _registry_with_outcome()
    reg.schemas[OTHER_ID] = event_schema()
    return reg


def _reframed(data: bytes, schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + data[5:]


def _command(session: str = "s1") -> Command:
    return Command(
        command_id="c1",
        session_id=session,
        tenant_id="t",
        type="abort",
        ts=1,
        payload=AbortPayload(),
    )


def test_only_a_framed_record_of_an_id_never_met_would_ask_the_registry() -> None:
    reg = _registry()
    codec = Codec(schemas=reg)
    own = codec.encode_event(event("run.started"))
    other = _reframed(own, OTHER_ID)
    assert not codec.would_fetch("event", own)
    assert codec.would_fetch("event", other)
    assert reg.asked == [], "asking whether it would fetch fetches nothing"
    assert codec.decode_event(other) == codec.decode_event(own)
    assert reg.asked == [OTHER_ID]
    assert not codec.would_fetch("event", other), "an id met once is known"
    # single-object records carry their schema's fingerprint, and a codec without a
    # registry refuses a framed id at once: neither asks anything
    assert not codec.would_fetch("event", Codec().encode_event(event("run.started")))
    assert not Codec().would_fetch("event", _reframed(own, 99))
    assert not codec.would_fetch("outcome", b"\x00\x00")  # too short to name an id


class _Producer:
    def __init__(self, queued: int = 0) -> None:
        self.queued, self.produced = queued, 0

    def __len__(self) -> int:
        return self.queued

    def produce(self, *args: object, **kwargs: object) -> None:
        self.produced += 1

    def poll(self, timeout: float = 0) -> int:
        return 0


def test_submit_without_waiting_sends_nothing_until_the_client_knows_where_to_read() -> None:
    c = SessionClient("t", S, codec=Codec(schemas=_registry()))
    with pytest.raises(WouldWait):
        c.submit_many([_command()], wait=False)
    assert c._producer is None and c._tail is None, "nothing was made on the way"
    # producer and partition count ready, but the tail has not read the partition's end
    producer = _Producer()
    c._producer, c._partitions = producer, 4  # type: ignore[assignment]
    with pytest.raises(WouldWait):
        c.submit_many([_command()], wait=False)
    assert producer.produced == 0 and not c._matcher._pending, "nothing is tracked"


def test_submit_without_waiting_leaves_a_full_producer_queue_to_a_caller_that_may_wait() -> None:
    c = SessionClient("t", S, codec=Codec(schemas=_registry()))
    producer = _Producer(queued=1000)
    c._producer, c._partitions = producer, 4  # type: ignore[assignment]
    c._fetched_end = lambda topic, p: 0  # type: ignore[method-assign]
    with pytest.raises(WouldWait, match="1000 records wait"):
        c.submit_many([_command()], wait=False)
    assert producer.produced == 0
    producer.queued = 0
    c._tail = SimpleNamespace(incremental_assign=lambda parts: None)  # type: ignore[assignment]
    c._tailing = {(t, p): 0 for t in (OUT, EV) for p in range(4)}
    [h] = c.submit_many([_command()], wait=False)
    assert producer.produced == 1 and isinstance(h, CommandHandle)


def test_a_drain_that_may_not_wait_holds_the_record_needing_the_registry_and_what_follows() -> None:
    reg = _registry()
    c = SessionClient("t", S, codec=Codec(schemas=reg))
    h = _tracked(c, "s1", 10)
    fields = {"run_id": "r1", "event_count": 2, "first_event_offset": 20, "last_event_offset": 21}
    batch = [
        _msg(OUT, b"s1/x", 12, _outcome(h, "accepted", **fields)),
        _msg(EV, b"s1/r1/1", 20, _reframed(_event_of(h, "run.cancel_requested", 1), OTHER_ID)),
        _msg(EV, b"s1/r1/2", 21, _event_of(h, "run.finished", 2)),
    ]
    # the tail's own position is past every record it handed over, held or not
    c._tail = SimpleNamespace(  # type: ignore[assignment]
        poll=lambda timeout: None,
        position=lambda parts: [SimpleNamespace(offset=22) for _ in parts],
    )
    c._tailing = {(OUT, 0): 10, (EV, 0): 10}
    assert c._drain_batch(batch, wait=False) is False
    assert c.held and reg.asked == []
    assert c._step(h) is None, "its first event is held: the outcome is not complete"
    c._drain(0, wait=False)
    assert c.held and reg.asked == [], "a later drain that may not wait keeps holding"
    c._drain(0)
    assert not c.held and reg.asked == [OTHER_ID]
    got = c._step(h)
    assert got is not None and got.status == "accepted"
    assert [e.type for e in got.events] == ["run.cancel_requested", "run.finished"]
