"""`check_topics` on a cluster whose brokers' metadata lags a topic just created: a topic
missing from one listing is asked for again for a moment; one still missing is missing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sessionstream.adapters import topics
from sessionstream.errors import TopicMisconfigured
from sessionstream.settings import Settings


class LaggingAdmin:
    """list_topics: the first `lag` answers leave out `late`; partitions per topic as given
    (the commands topic with one partition more, so the check stops right after the
    missing-topic check, at the partition counts, without describing configs)."""

    def __init__(self, names: list[str], late: str, lag: int, odd: str) -> None:
        self.names, self.late, self.lag, self.odd = names, late, lag, odd
        self.calls = 0

    def list_topics(self, timeout: float = 0) -> Any:
        self.calls += 1
        shown = [n for n in self.names if n != self.late or self.calls > self.lag]
        return SimpleNamespace(
            topics={
                n: SimpleNamespace(partitions=dict.fromkeys(range(5 if n == self.odd else 4)))
                for n in shown
            }
        )


def _admin(monkeypatch: pytest.MonkeyPatch, lag: int) -> tuple[Settings, LaggingAdmin]:
    s = Settings()
    names = [sp.name for sp in topics.topic_specs(s)]
    admin = LaggingAdmin(names, late=s.events_topic, lag=lag, odd=s.commands_topic)
    monkeypatch.setattr(topics, "_admin", lambda settings: admin)
    monkeypatch.setattr(topics, "MISSING_GRACE_S", 1.0)
    return s, admin


def test_a_topic_late_in_one_brokers_metadata_is_asked_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, admin = _admin(monkeypatch, lag=2)
    with pytest.raises(TopicMisconfigured, match="partition counts differ"):
        topics.check_topics(s)
    assert admin.calls == 3  # past the missing-topic check on the third listing


def test_a_topic_still_missing_after_the_grace_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, admin = _admin(monkeypatch, lag=10**9)
    with pytest.raises(TopicMisconfigured, match="missing") as refused:
        topics.check_topics(s)
    assert s.events_topic in str(refused.value) and admin.calls > 1


@pytest.mark.parametrize(
    ("retention", "refused"),
    [
        ("-1", False),  # kept for ever
        (str(7 * 24 * 3600 * 1000), False),  # as created
        (str(2 * 24 * 3600 * 1000), False),  # exactly two dedup windows
        (str(2 * 24 * 3600 * 1000 - 1), True),
        (str(24 * 3600 * 1000), True),  # one window: a full restore would miss the rest
        ("", True),  # not reported: unknown is not enough
    ],
)
def test_the_outcomes_retention_covers_two_dedup_windows(retention: str, refused: bool) -> None:
    """The outcome records are the dedup records' only copy in Kafka, and a full restore
    reads the last two dedup windows (24 h each by default) of them."""
    config = {"retention.ms": retention} if retention else {}
    if refused:
        with pytest.raises(TopicMisconfigured, match="must be at least 172800000"):
            topics._check_outcomes_retention("session.outcomes", config, 24 * 3600 * 1000)
    else:
        topics._check_outcomes_retention("session.outcomes", config, 24 * 3600 * 1000)
