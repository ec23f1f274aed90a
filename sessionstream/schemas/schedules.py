"""The schedule commands' payloads and events: a session's prompts sent on a cron or an
interval.

A schedule is kept in the session's state and fired by the processor's own timer
(`timer.fired` of kind `schedule`); the decider checks every rule of a definition (the
expression, the zone, the interval, the bounds) and refuses a bad one with
`invalid_schedule`, so the wire form only bounds sizes (docs/protocol.md#schedules).
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from sessionstream.schemas._base import Payload
from sessionstream.schemas.inputs import JsonInput, is_absent
from sessionstream.schemas.labels import Labels

__all__ = [
    "MAX_SCHEDULE_ID_CHARS",
    "SCHEDULE_ID_PATTERN",
    "ScheduleCatchUp",
    "ScheduleCreatePayload",
    "ScheduleDefined",
    "ScheduleDeletePayload",
    "ScheduleDeleted",
    "ScheduleFired",
    "ScheduleOverlap",
    "ScheduleUpdatePayload",
]

#: a schedule id: short (the timer's command id and the actor `schedule:<id>` hold it) and
#: safe in a URL path
MAX_SCHEDULE_ID_CHARS: Final = 64
SCHEDULE_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

#: what a firing does while the session has an active run: the prompt's own policies
#: (`reject`: a recorded `session_busy`; `enqueue`; `interrupt`), or `skip` (the firing is
#: recorded as skipped, nothing is asked)
ScheduleOverlap = Literal["reject", "enqueue", "interrupt", "skip"]
#: what a firing found late (after the processor was down) does: `once` (one prompt for
#: everything missed), `all` (one prompt per missed time, oldest first, at most `maxCatchUp`),
#: `skip` (nothing until the next time on time)
ScheduleCatchUp = Literal["once", "all", "skip"]

_MAX_WIRE_INT: Final = 2**53 - 1
_MAX_REF_CHARS: Final = 2048


class ScheduleCreatePayload(Payload):
    """A new schedule: `cron` (five fields, in `timezone`) or `intervalMs`, exactly one;
    the prompt it sends (`text`, `input`, `metadata`, `timeoutMs`, `contextRef`); `overlap`,
    `catchUp` (`maxCatchUp` bounds `all`), and `jitterMs`, a delay in [0, jitterMs] derived
    from the schedule and the time (the same on every replay)."""

    schedule_id: str = Field(
        min_length=1, max_length=MAX_SCHEDULE_ID_CHARS, pattern=SCHEDULE_ID_PATTERN
    )
    cron: str | None = Field(default=None, max_length=200)
    timezone: str = Field(default="UTC", min_length=1, max_length=64)
    interval_ms: int | None = Field(default=None, ge=-_MAX_WIRE_INT, le=_MAX_WIRE_INT)
    # the prompt: text, typed input, labels, deadline, context
    text: str
    input: JsonInput = Field(default=None, exclude_if=is_absent)
    #: the labels of each run it starts (a prompt's `metadata`, same bounds; null: none)
    metadata: Labels = Field(default=None, exclude_if=is_absent)
    timeout_ms: int | None = Field(default=None, gt=0, le=_MAX_WIRE_INT)
    context_ref: str | None = Field(default=None, max_length=_MAX_REF_CHARS)
    overlap: ScheduleOverlap = "skip"
    catch_up: ScheduleCatchUp = "once"
    max_catch_up: int = Field(default=10, ge=-_MAX_WIRE_INT, le=_MAX_WIRE_INT)
    jitter_ms: int = Field(default=0, ge=-_MAX_WIRE_INT, le=_MAX_WIRE_INT)


class ScheduleUpdatePayload(ScheduleCreatePayload):
    """Replace a schedule's whole definition; its next firing is computed again from the
    update's time (a timer fired for the old definition is stale)."""


class ScheduleDeletePayload(Payload):
    """Remove a schedule; a firing already on its way is refused `timer_stale`."""

    schedule_id: str = Field(
        min_length=1, max_length=MAX_SCHEDULE_ID_CHARS, pattern=SCHEDULE_ID_PATTERN
    )


# -- the events a schedule gives ---------------------------------------------------------------


class ScheduleDefined(Payload):
    """`schedule.created` / `schedule.updated`: the whole definition as it is kept, and its
    first firing computed at the event's time (`nextNominalAt` by the cron or the interval,
    `nextAt` with the jitter): the fold copies them, never computes one."""

    schedule_id: str
    cron: str | None = None
    timezone: str = "UTC"
    interval_ms: int | None = None
    text: str
    #: the prompt's typed input, compact JSON text (null: none)
    input: str | None = None
    #: the labels of each run it starts (null: none)
    metadata: Labels = None
    timeout_ms: int | None = None
    context_ref: str | None = None
    overlap: ScheduleOverlap
    catch_up: ScheduleCatchUp
    max_catch_up: int
    jitter_ms: int = 0
    #: an interval's origin: its firings are at anchorAt + k * intervalMs
    anchor_at: int
    next_nominal_at: int
    next_at: int
    actor: str | None = None


class ScheduleDeleted(Payload):
    """The schedule is gone; a firing on its way is refused `timer_stale`."""

    schedule_id: str
    actor: str | None = None


class ScheduleFired(Payload):
    """A schedule's time came (`nominalAt`, jitter aside). `outcome`: `prompted` (its
    prompt's own outcome follows: run.started, run.queued, or command.rejected), or
    `skipped` with `reason` `busy` (overlap `skip`) or `late` (catch-up `skip`). `missed`:
    the later times passed over at once (counted up to 100); `caughtUp`: how many late
    firings in a row this one is (catch-up `all`); then the next firing, computed here."""

    schedule_id: str
    nominal_at: int
    outcome: Literal["prompted", "skipped"]
    reason: str | None = None
    missed: int = 0
    caught_up: int = 0
    next_nominal_at: int
    next_at: int
