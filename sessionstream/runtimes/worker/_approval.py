"""What a handler sees of the action gate's refusals, and the digest a person approves."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sessionstream.errors import SessionstreamError

__all__ = ["ActionDenied", "args_digest"]


class ActionDenied(SessionstreamError):
    """The gate denied the action: the run is compacting or cancelling, a person said no
    (`reason` names who: "denied by user:bo"), the approval's window closed
    (`approval_expired`), ..."""

    def __init__(self, idempotency_key: str, reason: str | None) -> None:
        super().__init__(f"action {idempotency_key!r} denied: {reason}")
        self.idempotency_key = idempotency_key
        self.reason = reason


def args_digest(arguments: Any) -> str:
    """`sha256:` + hex of the arguments' canonical JSON (keys sorted, no spaces, non-ASCII
    kept): the same arguments give the same digest on every holder."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
