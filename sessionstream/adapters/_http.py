"""What HTTP clients of ours (the model adapter, the webhook sender) read alike."""

from __future__ import annotations

import email.utils

__all__ = ["retry_after_s"]


def retry_after_s(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` header asks for (RFC 9110: delta-seconds or an HTTP date,
    counted from `now`, epoch seconds); None when it says neither."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)
