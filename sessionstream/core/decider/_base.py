"""Ids, limits and the decision record of the decider."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Final

from sessionstream.core.state import (
    SessionState,
)
from sessionstream.schemas.commands import (
    Command,
)
from sessionstream.schemas.events import (
    Event,
)

#: namespace of run ids: uuid5(RUN_ID_NAMESPACE, "{session}/{command}/{n}")
RUN_ID_NAMESPACE: Final = uuid.UUID("6f0c2d4e-5b1a-5c8e-9a57-0d1f2e3c4b5a")


_NS: Final = RUN_ID_NAMESPACE.bytes


def run_id_for(name: str) -> str:
    """`str(uuid.uuid5(RUN_ID_NAMESPACE, name))`, without the UUID object (a fifth of the
    cost; a unit test holds the two equal)."""
    h = bytearray(hashlib.sha1(_NS + name.encode()).digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x50  # version 5
    h[8] = (h[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


#: the gate's refusal once a run has asked for `max_actions` keys; not recorded per key
_TOO_MANY_ACTIONS: Final = "too_many_actions"


#: a repeat of a key that needed approval, with other arguments; not recorded either
_DIGEST_MISMATCH: Final = "digest_mismatch"


_UNRECORDED: Final = frozenset({_TOO_MANY_ACTIONS, _DIGEST_MISMATCH})


#: a pending key whose holder lost the lease: the next holder may ask for it again
_LEASE_LOST: Final = "lease_lost"


@dataclass(frozen=True)
class DeciderConfig:
    """Limits and defaults. Part of the decider's input: change it and replay changes too."""

    #: a payload larger than this (as JSON) is rejected with `payload_too_large`
    max_payload_bytes: int = 256 * 1024
    #: run deadline when the prompt names none, and the most a prompt may ask for
    default_run_timeout_ms: int = 10 * 60 * 1000
    max_run_timeout_ms: int = 24 * 60 * 60 * 1000
    #: how long a holder has to acknowledge a cancel before its lease is taken away
    cancel_grace_ms: int = 30 * 1000
    #: the longest lease a worker is granted (a longer ask is capped, and the grant says so)
    max_lease_ms: int = 5 * 60 * 1000
    #: how long a command id is remembered for duplicate detection (by the decider's clock);
    #: the caller's dedup store forgets records older than this
    dedup_ttl_ms: int = 24 * 60 * 60 * 1000
    #: waiting prompts / follow-ups per session
    max_queue: int = 32
    #: steers and follow-ups pending for the active run
    max_inputs: int = 32
    #: producer text the session's state may hold (active prompt + inputs + queue), UTF-8
    max_held_bytes: int = 512 * 1024
    #: idempotency keys the gate decides per run
    max_actions: int = 64
    #: terminal runs remembered per session, to answer their late writers precisely
    finished_window: int = 16
    #: a step's result held inline (UTF-8 of `result` + `resultRef`); beyond: a pointer
    max_step_result_bytes: int = 8 * 1024
    #: recorded steps the active run holds, and their held bytes (`StepRecord.held_bytes`)
    max_steps: int = 128
    max_run_step_bytes: int = 128 * 1024
    #: calls started and not finished the run tracks, to close them when the lease is lost
    max_open_calls: int = 32
    #: (tenant, kind) pairs whose actions wait for a person (`*`: any), from
    #: `SESSIONSTREAM_APPROVAL_KINDS` (`sessionstream.core.approvals`); empty: none do
    approval_policy: tuple[tuple[str, str], ...] = ()
    #: how long a pending approval waits for a person (by the decider's clock)
    approval_ttl_ms: int = 15 * 60 * 1000
    #: a session idle this long after its last run finished is erased (its `retention`
    #: timer, by the decider's clock); None: kept until an administrator erases it
    retention_ms: int | None = None


DEFAULT_CONFIG: Final = DeciderConfig()


@dataclass(frozen=True)
class Decision:
    """What one command decided."""

    events: list[Event]
    #: the session's state after the events
    state: SessionState
    #: the content digest the caller records for this command id (see `command_digest`),
    #: with `state.clock` as its time; or None: nothing to record (a duplicate, a reused
    #: id, a command from another tenant, a timer that was not due)
    remember: int | None

    @property
    def duplicate(self) -> bool:
        return not self.events


def command_digest(command: Command, payload_json: bytes | None = None) -> int:
    """64-bit digest of what a command asks (not when): an exact re-send has the same one,
    the same id with another type, target or payload does not. The digested bytes: each of
    type, tenant, run, worker, generation, actor as `\x01{value}\x1f` (`\x00\x1f` when
    absent), then the payload's JSON."""
    if payload_json is None:
        payload_json = command.payload.__pydantic_serializer__.to_json(command.payload)
    c = command
    text = (
        f"\x01{c.type}\x1f\x01{c.tenant_id}\x1f"
        + ("\x00\x1f" if c.run_id is None else f"\x01{c.run_id}\x1f")
        + ("\x00\x1f" if c.worker_id is None else f"\x01{c.worker_id}\x1f")
        + ("\x00\x1f" if c.generation is None else f"\x01{c.generation}\x1f")
        + ("\x00\x1f" if c.actor is None else f"\x01{c.actor}\x1f")
    )
    return int.from_bytes(
        hashlib.blake2b(text.encode() + payload_json, digest_size=8).digest(), "big"
    )
