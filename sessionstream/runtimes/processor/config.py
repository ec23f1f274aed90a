"""The decider's configuration from the processor's settings."""

from __future__ import annotations

from sessionstream.core.approvals import parse_approval_kinds
from sessionstream.core.decider import DeciderConfig
from sessionstream.settings import Settings

__all__ = ["decider_config"]


def decider_config(settings: Settings) -> DeciderConfig:
    """The settings that are part of the decider's input (change one, and a replay of the
    same commands decides otherwise): limits, the approval policy and window, the
    retention, the schedules' bounds."""
    return DeciderConfig(
        max_payload_bytes=settings.max_payload_bytes,
        max_lease_ms=settings.max_lease_ms,
        approval_policy=parse_approval_kinds(settings.approval_kinds),
        approval_ttl_ms=settings.approval_ttl_ms,
        question_ttl_ms=settings.question_ttl_ms,
        retention_ms=settings.session_retention_ms,
        max_schedules=settings.max_schedules,
        schedule_min_interval_ms=settings.schedule_min_interval_ms,
    )
