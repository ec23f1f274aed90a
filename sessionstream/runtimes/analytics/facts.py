"""What the analytics table stores: one record per run, per rejection, and per partition.

Every value is small, frozen and JSON-encoded, so a changelog record is the whole truth
about its key: re-applying an event that is already in a record changes nothing, which is
what makes the fold idempotent (see `sessionstream.runtimes.analytics.fold`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Final

__all__ = [
    "CURSOR_PREFIX",
    "REJECTION_PREFIX",
    "RUN_PREFIX",
    "Cursor",
    "Fact",
    "Rejection",
    "RunFacts",
    "cursor_key",
    "decode_fact",
    "encode_fact",
    "fact_from_json",
    "fact_to_json",
    "rejection_key",
    "run_key",
]

RUN_PREFIX: Final = "r|"
REJECTION_PREFIX: Final = "x|"
CURSOR_PREFIX: Final = "c|"


@dataclass(frozen=True, slots=True)
class RunFacts:
    """One run, as far as analytics cares: who, when it started, was cancelled, ended."""

    session_id: str
    run_id: str
    tenant_id: str
    partition: int
    #: highest `seq` of this run already folded in; an event at or below it is a repeat
    last_seq: int
    started_at: int | None = None
    cancel_requested_at: int | None = None
    finished_at: int | None = None
    terminal_status: str | None = None

    @property
    def active(self) -> bool:
        return self.started_at is not None and self.finished_at is None

    @property
    def cancel_latency_ms(self) -> int | None:
        """`run.cancel_requested` -> `run.finished {cancelled}`, in ms of event time."""
        if (
            self.terminal_status == "cancelled"
            and self.cancel_requested_at is not None
            and self.finished_at is not None
        ):
            return max(0, self.finished_at - self.cancel_requested_at)
        return None

    @property
    def expires_at(self) -> int | None:
        """Event time after which a finished run may be forgotten (active runs never are)."""
        return self.finished_at


@dataclass(frozen=True, slots=True)
class Rejection:
    """One `command.rejected` event, keyed by its event key (so it exists at most once)."""

    tenant_id: str
    partition: int
    at: int
    reason: str
    command_type: str

    @property
    def expires_at(self) -> int:
        return self.at


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far one source partition is folded into the table, written after the facts.

    A partition's facts and its cursor go to the same changelog partition through one
    producer, in order, so a cursor that survived a crash proves every fact written before
    it survived too: a restart resumes the partition at `next_offset`, never at faust's
    separately committed offset.
    """

    next_offset: int
    #: largest event `ts` seen on the partition
    watermark: int
    #: events with `ts` below it are ignored and facts that ended below it are deleted
    horizon: int


Fact = RunFacts | Rejection | Cursor

_TAGS: Final[dict[type[Any], str]] = {RunFacts: "run", Rejection: "rej", Cursor: "cur"}
_BY_TAG: Final[dict[str, type[Any]]] = {v: k for k, v in _TAGS.items()}


def run_key(session_id: str, run_id: str) -> str:
    return f"{RUN_PREFIX}{session_id}/{run_id}"


def rejection_key(event_key: str) -> str:
    return f"{REJECTION_PREFIX}{event_key}"


def cursor_key(partition: int) -> str:
    return f"{CURSOR_PREFIX}{partition}"


def fact_to_json(fact: Fact) -> dict[str, Any]:
    """The fact as a JSON object with its type tag (`t`)."""
    body = asdict(fact)
    body["t"] = _TAGS[type(fact)]
    return body


def fact_from_json(body: dict[str, Any]) -> Fact:
    """The inverse of `fact_to_json`; KeyError or TypeError for a body this version cannot
    read (an unknown tag or field)."""
    body = dict(body)
    cls = _BY_TAG[body.pop("t")]
    fact: Fact = cls(**body)
    return fact


def encode_fact(fact: Fact) -> bytes:
    """Compact JSON with a type tag; deterministic (same fact, same bytes)."""
    return json.dumps(fact_to_json(fact), separators=(",", ":"), sort_keys=True).encode()


def decode_fact(data: bytes) -> Fact:
    return fact_from_json(json.loads(data))
