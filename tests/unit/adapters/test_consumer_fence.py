"""When a fenced static member of the processor group renews itself, and when it stops.

From the rule (docs/operations.md, librdkafka#3437): a consumer whose own session timed out
during a broker fault rejoins under a new member id and is fenced for its old one; that may
happen at every fault, however close together. A fence without such a timeout, soon after
a renewal, is a second live processor with the same instance id, and this one stops.
"""

from __future__ import annotations

import logging

import pytest

from sessionstream.adapters.kafka.transactions import (
    RENEW_WINDOW_S,
    SELF_FENCE_S,
    GroupLog,
    consumer_fence_is_foreign,
)

NOW = 10_000.0


def test_a_first_fence_renews() -> None:
    assert not consumer_fence_is_foreign(NOW, renewed_at=None, session_timeout_at=None)


def test_a_second_fence_soon_after_without_a_session_timeout_is_another_instance() -> None:
    assert consumer_fence_is_foreign(NOW, renewed_at=NOW - 5, session_timeout_at=None)


def test_two_broker_faults_within_the_window_each_renew() -> None:
    # the 3-node cluster test's log: renewed 46 s before, own session timeout 2.4 s before
    assert not consumer_fence_is_foreign(NOW, renewed_at=NOW - 46, session_timeout_at=NOW - 2.4)


def test_an_old_session_timeout_does_not_excuse_a_fence() -> None:
    old = NOW - SELF_FENCE_S - 1
    assert consumer_fence_is_foreign(NOW, renewed_at=NOW - 10, session_timeout_at=old)


def test_a_renewal_outside_the_window_renews_again() -> None:
    assert not consumer_fence_is_foreign(
        NOW, renewed_at=NOW - RENEW_WINDOW_S - 1, session_timeout_at=None
    )


def test_the_group_log_forwards_every_line_and_notes_session_timeouts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = GroupLog()
    caplog.set_level(logging.DEBUG, logger="sessionstream.adapters.kafka")
    g.log(logging.INFO, "%s [%s] %s", "FAIL", "processor-p0#consumer-1", "broker down")
    assert g.session_timeout_at is None
    g.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "processor-p0#consumer-1", "timed out")
    assert g.session_timeout_at is not None
    assert [r.getMessage() for r in caplog.records] == [
        "FAIL [processor-p0#consumer-1] broker down",
        "SESSTMOUT [processor-p0#consumer-1] timed out",
    ]
    assert [r.name for r in caplog.records] == ["sessionstream.adapters.kafka"] * 2


def test_librdkafka_calls_the_group_log_with_the_facility_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What `GroupLog` relies on: confluent-kafka passes (facility, client name, line)."""
    from confluent_kafka import Consumer

    caplog.set_level(logging.DEBUG, logger="sessionstream.adapters.kafka")
    seen: list[tuple[object, ...]] = []

    class Recording(GroupLog):
        def log(self, level: int, msg: str, *args: object) -> None:
            seen.append(args)
            super().log(level, msg, *args)

    c = Consumer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "group.id": "g",
            "logger": Recording(),
            "debug": "generic",
        }
    )
    try:
        c.poll(0.2)
    finally:
        c.close()
    assert any(a[0] == "INIT" and "librdkafka" in str(a[2]) for a in seen), seen[:3]
    assert any(r.getMessage().startswith("INIT [") for r in caplog.records)
