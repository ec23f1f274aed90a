"""Producers and agent authors import from `sessionstream` only: the SDK's names are there
and are the runtime's own objects."""

from __future__ import annotations

import consumers.worker
import sessionstream.agent


def test_the_agent_sdk_is_under_sessionstream() -> None:
    assert sorted(sessionstream.agent.__all__) == sorted(consumers.worker.__all__)
    for name in consumers.worker.__all__:
        assert getattr(sessionstream.agent, name) is getattr(consumers.worker, name)


def test_the_producer_sdk_is_under_sessionstream() -> None:
    from sessionstream.client import CommandHandle, Outcome, SessionClient

    assert SessionClient.wait and CommandHandle and Outcome
