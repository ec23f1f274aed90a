"""Base configuration shared by every confluent-kafka client sessionstream creates."""

from __future__ import annotations

import logging
from typing import Any

from sessionstream.settings import Settings

__all__ = ["client_config"]

#: librdkafka's own log lines go here, not straight to stderr: a broker that is down
#: would otherwise print a line every 50 ms; the error reaches the user as an exception
KAFKA_LOG = logging.getLogger("sessionstream.kafka")


def client_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """bootstrap.servers plus the logger; `overrides` win."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.kafka_bootstrap, "logger": KAFKA_LOG}
    conf.update(overrides)
    return conf
