"""Schedules: `schedule.create` / `update` / `delete`, and a schedule's timer firing.

Every next firing time is computed here, once, at the decision's time (the log's clock), and
recorded in the event; `evolve` only copies it. A cron expression is read in its zone by
`sessionstream.core.cron` (the tz database is the one outside input: docs/protocol.md#schedules).
"""

from __future__ import annotations

import hashlib
from typing import Final

from sessionstream.core.cron import CronError, next_fire, parse_cron, zone
from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.decider._producer import _ask
from sessionstream.core.state import Schedule
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import (
    Command,
    ScheduleCreatePayload,
    ScheduleDeletePayload,
    TimerFiredPayload,
    json_text,
)
from sessionstream.schemas.events import (
    SESSION_LOG,
    ScheduleDefined,
    ScheduleDeleted,
    ScheduleFired,
)

#: the longest interval, and the largest jitter and catch-up bound a schedule may ask for
MAX_INTERVAL_MS: Final = 366 * 24 * 60 * 60 * 1000
MAX_JITTER_MS: Final = 60 * 60 * 1000
MAX_CATCH_UP: Final = 100
#: later times passed over by one late firing are counted up to this many
MISSED_COUNT_CAP: Final = 100


def schedule_actor(schedule_id: str) -> str:
    """Who asks when a schedule fires."""
    return f"schedule:{schedule_id}"


def _jitter(session_id: str, schedule_id: str, nominal: int, jitter_ms: int) -> int:
    """A delay in [0, jitter_ms] that only the schedule and its time decide."""
    if jitter_ms <= 0:
        return 0
    h = hashlib.blake2b(f"{session_id}\x1f{schedule_id}\x1f{nominal}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big") % (jitter_ms + 1)


def _nominal_after(
    cron: str | None, tz: str, interval_ms: int | None, anchor: int, after: int
) -> int | None:
    """The first time by the cron or the interval strictly after `after`."""
    if interval_ms is not None:
        if after < anchor:
            return anchor + interval_ms
        return anchor + ((after - anchor) // interval_ms + 1) * interval_ms
    assert cron is not None
    return next_fire(parse_cron(cron), tz, after)


def _problem(em: _Emitter, p: ScheduleCreatePayload) -> str | None:
    """Why the definition cannot be kept (None: it can)."""
    if (p.cron is None) == (p.interval_ms is None):
        return "a schedule has exactly one of cron and intervalMs"
    if p.cron is not None:
        try:
            expr = parse_cron(p.cron)
            zone(p.timezone)
        except CronError as e:
            return str(e)
        # a jitter as long as the time between two firings would reorder them
        first = next_fire(expr, p.timezone, em.now)
        second = None if first is None else next_fire(expr, p.timezone, first)
        if first is not None and second is not None and p.jitter_ms >= second - first:
            return f"jitterMs {p.jitter_ms} is not below the {second - first} ms between firings"
    else:
        assert p.interval_ms is not None
        least = em.config.schedule_min_interval_ms
        if p.interval_ms < least:
            return f"intervalMs {p.interval_ms} is below the least allowed, {least}"
        if p.interval_ms > MAX_INTERVAL_MS:
            return f"intervalMs {p.interval_ms} is above the most allowed, {MAX_INTERVAL_MS}"
        if p.jitter_ms >= p.interval_ms:
            return f"jitterMs {p.jitter_ms} is not below intervalMs {p.interval_ms}"
    if not 0 <= p.jitter_ms <= MAX_JITTER_MS:
        return f"jitterMs {p.jitter_ms} is outside 0-{MAX_JITTER_MS}"
    if not 1 <= p.max_catch_up <= MAX_CATCH_UP:
        return f"maxCatchUp {p.max_catch_up} is outside 1-{MAX_CATCH_UP}"
    return None


def _define(em: _Emitter, cmd: Command) -> None:
    """`schedule.create` and `schedule.update` (a whole new definition)."""
    p = cmd.payload_as(ScheduleCreatePayload)
    state, cfg = em.state, em.config
    old = state.schedule(p.schedule_id)
    creating = cmd.type == "schedule.create"
    if creating and old is not None:
        em.reject("schedule_exists", f"schedule {p.schedule_id} exists: update or delete it")
        return
    if not creating and old is None:
        em.reject("unknown_schedule", f"no schedule {p.schedule_id} in this session")
        return
    if creating and len(state.schedules) >= cfg.max_schedules:
        em.reject(
            "too_many_schedules",
            f"{len(state.schedules)} schedules (maxSchedules {cfg.max_schedules})",
        )
        return
    problem = _problem(em, p)
    if problem is not None:
        em.reject("invalid_schedule", problem)
        return
    input = None if p.input is None else json_text(p.input)
    held = state.held_bytes() - (0 if old is None else old.held_bytes())
    held += len(p.text.encode()) + (0 if input is None else len(input.encode()))
    if held > cfg.max_held_bytes:
        em.reject(
            "too_many_schedules", f"{held} bytes of text held > maxHeldBytes {cfg.max_held_bytes}"
        )
        return
    nominal = _nominal_after(p.cron, p.timezone, p.interval_ms, em.now, em.now)
    if nominal is None:  # parse_cron refuses an expression that never fires
        em.reject("invalid_schedule", f"{p.cron!r} has no firing time ahead")
        return
    em.emit(
        SESSION_LOG,
        "schedule.created" if creating else "schedule.updated",
        make(
            ScheduleDefined,
            schedule_id=p.schedule_id,
            cron=p.cron,
            timezone=p.timezone,
            interval_ms=p.interval_ms,
            text=p.text,
            input=input,
            metadata=p.metadata,
            timeout_ms=p.timeout_ms,
            context_ref=p.context_ref,
            overlap=p.overlap,
            catch_up=p.catch_up,
            max_catch_up=p.max_catch_up,
            jitter_ms=p.jitter_ms,
            anchor_at=em.now,
            next_nominal_at=nominal,
            next_at=nominal + _jitter(state.session_id, p.schedule_id, nominal, p.jitter_ms),
            actor=cmd.actor,
        ),
    )


def _delete(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(ScheduleDeletePayload)
    if em.state.schedule(p.schedule_id) is None:
        em.reject("unknown_schedule", f"no schedule {p.schedule_id} in this session")
        return
    em.emit(
        SESSION_LOG,
        "schedule.deleted",
        make(ScheduleDeleted, schedule_id=p.schedule_id, actor=cmd.actor),
    )


def _fire(em: _Emitter, cmd: Command) -> None:
    """A schedule's timer: honoured only for the schedule's current definition, at the
    time its state says, once that time has come by the decider's clock."""
    p = cmd.payload_as(TimerFiredPayload)
    sid = p.schedule_id or ""
    sc = em.state.schedule(sid)
    now = em.now
    if sc is None:
        em.reject("timer_stale", f"schedule {sid} does not exist")
        return
    if cmd.generation != sc.revision:
        em.reject("timer_stale", f"revision {cmd.generation} != current {sc.revision}")
        return
    if p.due_at != sc.next_at or sc.next_at > now:
        em.reject("timer_stale", f"schedule {sid} fires at {sc.next_at}, not due at {now}")
        return
    missed = _count_between(sc, sc.next_nominal_at, now)
    late = missed > 0 or now - sc.next_at > em.config.schedule_late_ms
    caught_up = 0
    prompt = True
    reason: str | None = None
    after = now  # the next firing: the first time after this decision...
    if late and sc.catch_up == "skip":
        prompt, reason = False, "late"
    elif late and sc.catch_up == "all":
        if sc.caught_up < sc.max_catch_up:
            caught_up = sc.caught_up + 1
            if missed > 0:  # ...or, catching up, the oldest time still missed
                after = sc.next_nominal_at
        else:
            prompt, reason = False, "late"
    run = em.state.active
    if prompt and run is not None and sc.overlap == "skip":
        prompt, reason = False, "busy"
    nominal = _nominal_after(sc.cron, sc.timezone, sc.interval_ms, sc.anchor_at, after)
    if nominal is None:  # never for an expression parse_cron took; never a re-fire loop
        nominal = max(now, sc.next_nominal_at) + MAX_INTERVAL_MS
    if nominal > now:
        caught_up = 0  # on time again (or skipped past the outage): a later one counts anew
    em.emit(
        SESSION_LOG,
        "schedule.fired",
        make(
            ScheduleFired,
            schedule_id=sid,
            nominal_at=sc.next_nominal_at,
            outcome="prompted" if prompt else "skipped",
            reason=reason,
            missed=0 if after != now else missed,
            caught_up=caught_up,
            next_nominal_at=nominal,
            next_at=nominal + _jitter(em.state.session_id, sid, nominal, sc.jitter_ms),
        ),
    )
    if prompt:
        _ask(
            em,
            text=sc.text,
            policy="reject" if sc.overlap == "skip" else sc.overlap,
            context_ref=sc.context_ref,
            timeout_ms=sc.timeout_ms,
            input=sc.input_json,
            actor=schedule_actor(sid),
            metadata=sc.metadata or None,
        )


def _count_between(sc: Schedule, nominal: int, now: int) -> int:
    """How many times by the cron or the interval fall in (nominal, now], up to the cap."""
    n, at = 0, nominal
    if sc.interval_ms is not None:
        return min(MISSED_COUNT_CAP, max(0, (now - nominal) // sc.interval_ms))
    while n < MISSED_COUNT_CAP:
        nxt = _nominal_after(sc.cron, sc.timezone, None, sc.anchor_at, at)
        if nxt is None or nxt > now:
            break
        n, at = n + 1, nxt
    return n
