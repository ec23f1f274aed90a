"""Token deltas: the pieces of a model's answer as it streams, batched per model call and
published on the deltas topic outside any transaction, for the console and SSE clients.

A view, never the record: nothing decides on a delta, a lost one loses nothing (the
finished step and `model.request.finished` hold the whole answer), and a run's deltas stop
once its execution is fenced or done. One record per model call per interval carries the
text that arrived in it, numbered (`seq`, from 1 per call) so a reader puts them in order
and sees a gap.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["DELTA_TYPE", "MAX_PENDING_CHARS", "DeltaBuffer", "DeltaKey"]

log = logging.getLogger("sessionstream.worker")

#: the `type` of a delta record (and the SSE event type the gateway gives it)
DELTA_TYPE = "model.delta"
#: text of one call held at once; past it the call's deltas go out before the interval ends
MAX_PENDING_CHARS = 16_384


@dataclass(frozen=True)
class DeltaKey:
    """Which model call of which run a delta belongs to."""

    session_id: str
    tenant_id: str
    run_id: str
    generation: int | None
    call_id: str
    partition: int


@dataclass
class _Pending:
    parts: list[str] = field(default_factory=list)
    chars: int = 0


class DeltaBuffer:
    """Collects deltas (`add`) and hands one record per call to `send(partition, key,
    value)` at each `flush` (the worker's timer calls it every interval)."""

    def __init__(
        self,
        send: Callable[[int, bytes, bytes], None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._send = send
        self._clock = clock
        self._pending: dict[DeltaKey, _Pending] = {}
        #: per call: the seq of its last record (forgotten with `forget`)
        self._seq: dict[DeltaKey, int] = {}
        self.sent = 0

    def add(self, key: DeltaKey, text: str) -> None:
        """`text` of call `key`; an empty one says the call ended: what it gathered goes
        out now, not at the next interval (its finished event is on its way)."""
        if not text:
            self._flush_one(key)
            return
        pending = self._pending.setdefault(key, _Pending())
        pending.parts.append(text)
        pending.chars += len(text)
        if pending.chars >= MAX_PENDING_CHARS:
            self._flush_one(key)

    def flush(self) -> int:
        """Publish what every call gathered since the last flush; returns the records."""
        keys = list(self._pending)
        for key in keys:
            self._flush_one(key)
        return len(keys)

    def forget(self, run_id: str) -> None:
        """The run's execution ended here: what it gathered goes out, then its counters go."""
        for key in [k for k in self._pending if k.run_id == run_id]:
            self._flush_one(key)
        for key in [k for k in self._seq if k.run_id == run_id]:
            del self._seq[key]

    def _flush_one(self, key: DeltaKey) -> None:
        pending = self._pending.pop(key, None)
        if pending is None or not pending.parts:
            return
        seq = self._seq[key] = self._seq.get(key, 0) + 1
        value = {
            "type": DELTA_TYPE,
            "sessionId": key.session_id,
            "tenantId": key.tenant_id,
            "runId": key.run_id,
            "generation": key.generation,
            "callId": key.call_id,
            "seq": seq,
            "text": "".join(pending.parts),
            "ts": int(self._clock() * 1000),
        }
        record_key = f"{key.session_id}/{key.run_id}/{key.call_id}".encode()
        try:
            self._send(key.partition, record_key, json.dumps(value).encode())
            self.sent += 1
        except Exception as e:  # a view: a delta that cannot go out is not worth a run
            log.warning("a token delta of run %s was not published: %s", key.run_id, e)
