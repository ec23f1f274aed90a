"""Schedules (docs/protocol.md#schedules): the cron evaluator, and the decider's rules for
defining and firing them, tried as an attacker and an unlucky user would.

Expected outcomes come from the protocol's text; `Harness.apply` also checks every log
against the reference model and the fold after each command.
"""

from __future__ import annotations

import datetime as dt

import pytest

from sessionstream.core.cron import CronError, next_fire, parse_cron, zone
from sessionstream.core.decider import DeciderConfig
from sessionstream.core.state_codec import decode_state, encode_state
from sessionstream.core.timers import due_timers, timer_command
from sessionstream.schemas.events import Event, RunStarted, ScheduleFired
from tests.unit._harness import Harness, leased, running, tokens

MIN = 60_000


def ms(y: int, mo: int, d: int, h: int, mi: int, tz: str = "UTC", fold: int = 0) -> int:
    return int(dt.datetime(y, mo, d, h, mi, tzinfo=zone(tz), fold=fold).timestamp()) * 1000


def utc(at: int) -> str:
    return dt.datetime.fromtimestamp(at / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def firings(expr: str, tz: str, after: int, n: int) -> list[str]:
    out, at = [], after
    for _ in range(n):
        nxt = next_fire(parse_cron(expr), tz, at)
        assert nxt is not None
        out.append(utc(nxt))
        at = nxt
    return out


# -- the cron evaluator ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "after", "want"),
    [
        ("*/15 * * * *", ms(2026, 1, 1, 0, 7), ["2026-01-01 00:15", "2026-01-01 00:30"]),
        ("0 9-17/4 * * *", ms(2026, 1, 1, 0, 0), ["2026-01-01 09:00", "2026-01-01 13:00"]),
        ("5,10 0 * * *", ms(2026, 1, 1, 0, 5), ["2026-01-01 00:10", "2026-01-02 00:05"]),
        # names, any case; 2026-01-01 is a Thursday
        ("0 12 * JAN mon-Fri", ms(2026, 1, 1, 13, 0), ["2026-01-02 12:00", "2026-01-05 12:00"]),
        # 7 is Sunday, as 0 is
        ("0 0 * * 7", ms(2026, 1, 1, 0, 0), ["2026-01-04 00:00", "2026-01-11 00:00"]),
        # both day fields restricted: either matches (the 13th, or a Friday)
        ("0 0 13 * 5", ms(2026, 1, 1, 0, 0), ["2026-01-02 00:00", "2026-01-09 00:00"]),
        ("0 0 29 2 *", ms(2026, 1, 1, 0, 0), ["2028-02-29 00:00", "2032-02-29 00:00"]),
    ],
)
def test_cron_fires_when_the_fields_say(expr: str, after: int, want: list[str]) -> None:
    assert firings(expr, "UTC", after, len(want)) == want


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("61 * * * *", "minute field: 61 is outside 0-59"),
        ("* * *", "3 fields"),
        ("* * * * * *", "6 fields"),
        ("@daily", "nicknames are not supported"),
        ("0 0 L * *", "'L' is not a number"),
        ("0 0 ? * *", "is not supported"),
        ("0 0 1#2 * *", "is not supported"),
        ("*/0 * * * *", "step '0' is not a positive number"),
        ("30-10 * * * *", "runs backwards"),
        ("0 0 30 2 *", "names no day that exists"),
        ("0 0 * foo *", "'foo' is not a number or a name"),
        ("0 0 1,,2 * *", "an empty item"),
        ("", "0 fields"),
    ],
)
def test_a_bad_expression_is_refused_with_its_reason(expr: str, why: str) -> None:
    with pytest.raises(CronError, match=why.replace("?", r"\?").replace("*", r"\*")):
        parse_cron(expr)


@pytest.mark.parametrize(
    "name", ["Mars/Olympus", "", "../../etc/passwd", "/etc/localtime", "x" * 65]
)
def test_an_unknown_zone_is_refused(name: str) -> None:
    with pytest.raises(CronError, match="unknown time zone"):
        zone(name)


NY = "America/New_York"


def test_a_local_time_the_clocks_skip_fires_once_the_gap_later() -> None:
    """2026-03-08, New York: 02:00 EST jumps to 03:00 EDT. 02:30 does not exist that day:
    it fires at 03:30 EDT (07:30Z), once; the next day at 02:30 EDT (06:30Z)."""
    before = ms(2026, 3, 7, 12, 0, NY)
    assert firings("30 2 * * *", NY, before, 2) == ["2026-03-08 07:30", "2026-03-09 06:30"]
    # hourly: the skipped 02:00 and the real 03:00 are one instant, fired once
    assert firings("0 * * * *", NY, ms(2026, 3, 8, 0, 30, NY), 3) == [
        "2026-03-08 06:00",  # 01:00 EST
        "2026-03-08 07:00",  # 03:00 EDT (02:00 skipped, the same instant)
        "2026-03-08 08:00",  # 04:00 EDT
    ]


def test_a_local_time_the_clocks_repeat_fires_once_at_its_first_occurrence() -> None:
    """2026-11-01, New York: 02:00 EDT goes back to 01:00 EST. 01:30 happens twice: it
    fires at the first (05:30Z), not at the second (06:30Z)."""
    before = ms(2026, 10, 31, 12, 0, NY)
    assert firings("30 1 * * *", NY, before, 2) == ["2026-11-01 05:30", "2026-11-02 06:30"]
    # every 30 minutes: the repeated hour fires nothing again
    assert firings("*/30 * * * *", NY, ms(2026, 11, 1, 0, 50, NY), 4) == [
        "2026-11-01 05:00",  # 01:00 EDT
        "2026-11-01 05:30",  # 01:30 EDT
        "2026-11-01 07:00",  # 02:00 EST (01:00 and 01:30 EST are the repeats)
        "2026-11-01 07:30",
    ]


def test_the_decider_fires_a_zoned_cron_across_both_changes() -> None:
    h = Harness()
    h.now = ms(2026, 3, 7, 12, 0, NY)
    h.schedule(cron="30 2 * * *", timezone=NY)
    fired = []
    for _ in range(3):
        ev = h.fire("schedule")
        fired.append(utc(ev[0].ts))
        h.abort()  # unclaimed: cancelled at once, the next firing finds the session idle
    assert fired == ["2026-03-08 07:30", "2026-03-09 06:30", "2026-03-10 06:30"]
    h.now = ms(2026, 10, 31, 12, 0, NY)
    h.update_schedule(cron="30 1 * * *", timezone=NY)
    ev = h.fire("schedule")
    assert utc(ev[0].ts) == "2026-11-01 05:30"
    h.abort()
    assert utc(h.state.schedules[0].next_at) == "2026-11-02 06:30"


# -- defining ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"interval_ms": 0}, "intervalMs 0 is below the least allowed, 60000"),
        ({"interval_ms": -5}, "below the least allowed"),
        ({"interval_ms": 2**53 - 1}, "above the most allowed"),
        ({"interval_ms": MIN, "cron": "* * * * *"}, "exactly one of cron and intervalMs"),
        ({"interval_ms": None}, "exactly one of cron and intervalMs"),
        ({"cron": "0 0 * * *", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"cron": "0 0 31 4 *"}, "names no day that exists"),
        ({"interval_ms": MIN, "jitter_ms": MIN}, "jitterMs 60000 is not below intervalMs"),
        ({"cron": "0 * * * *", "jitter_ms": -1}, "jitterMs -1 is outside"),
        ({"cron": "0 0 * * *", "jitter_ms": 3_600_001}, "jitterMs 3600001 is outside"),
        ({"cron": "*/5 * * * *", "jitter_ms": 5 * MIN}, "not below the 300000 ms between"),
        ({"interval_ms": MIN, "max_catch_up": 0}, "maxCatchUp 0 is outside 1-100"),
        ({"interval_ms": MIN, "max_catch_up": 101}, "maxCatchUp 101 is outside 1-100"),
    ],
)
def test_an_invalid_definition_is_rejected_with_its_reason(kw: dict, why: str) -> None:
    h = Harness()
    ev = h.schedule(**kw)
    assert tokens(ev) == ["rejected:invalid_schedule"]
    assert why in (ev[0].payload.detail or "")  # type: ignore[attr-defined]
    assert h.state.schedules == ()


def test_the_first_firing_is_computed_from_the_logs_clock_not_the_producers() -> None:
    h = Harness()
    h.do(
        "schedule.create",
        {"schedule_id": "s1", "text": "t", "interval_ms": MIN},
        ts=h.now + 10 * 24 * 3600 * 1000,  # a producer whose clock is ten days ahead
    )
    assert h.state.schedules[0].next_at == h.now + MIN


def test_too_many_schedules_and_too_much_text_are_refused() -> None:
    h = Harness(DeciderConfig(max_schedules=2, max_held_bytes=100))
    assert tokens(h.schedule("a")) == ["schedule.created"]
    assert tokens(h.schedule("b")) == ["schedule.created"]
    ev = h.schedule("c")
    assert tokens(ev) == ["rejected:too_many_schedules"]
    assert "maxSchedules 2" in (ev[0].payload.detail or "")  # type: ignore[attr-defined]
    h.delete_schedule("b")
    ev = h.do("schedule.create", {"schedule_id": "c", "text": "x" * 200, "interval_ms": MIN})
    assert tokens(ev) == ["rejected:too_many_schedules"]
    assert "maxHeldBytes 100" in (ev[0].payload.detail or "")  # type: ignore[attr-defined]


def test_another_tenant_cannot_create_update_or_delete() -> None:
    h = Harness()
    h.schedule()
    for type_, payload in [
        ("schedule.create", {"schedule_id": "mine", "text": "t", "interval_ms": MIN}),
        ("schedule.update", {"schedule_id": "s1", "text": "evil", "interval_ms": MIN}),
        ("schedule.delete", {"schedule_id": "s1"}),
    ]:
        assert tokens(h.do(type_, payload, tenant="evil")) == ["rejected:tenant_mismatch"]
    assert [s.schedule_id for s in h.state.schedules] == ["s1"]
    assert h.state.schedules[0].text == "tick"


def test_a_schedule_gives_a_new_session_its_owner() -> None:
    h = Harness()
    h.schedule()
    assert h.state.tenant_id == h.tenant
    assert tokens(h.prompt(tenant="evil")) == ["rejected:tenant_mismatch"]


def test_update_changes_the_next_firing_and_stales_the_old_timer() -> None:
    h = Harness()
    h.schedule(interval_ms=MIN)
    old = h.timer("schedule")
    h.now = old.ts - 30_000
    h.update_schedule(interval_ms=10 * MIN, text="new")
    sc = h.state.schedules[0]
    assert sc.next_at == h.now + 10 * MIN and sc.text == "new"
    h.now = old.ts
    ev = h.apply(old)
    assert tokens(ev) == ["rejected:timer_stale"]
    assert h.state.active is None
    ev = h.fire("schedule")
    assert tokens(ev) == ["schedule.fired", "run.started:prompt"]
    assert ev[1].payload_as(RunStarted).prompt == "new"


def test_delete_after_a_firing_and_a_firing_after_a_delete() -> None:
    h = Harness()
    h.schedule()
    h.fire("schedule")
    assert tokens(h.delete_schedule()) == ["schedule.deleted"]
    assert due_timers(h.state) == [t for t in due_timers(h.state) if t.kind != "schedule"]
    assert tokens(h.delete_schedule()) == ["rejected:unknown_schedule"]


# -- firing ------------------------------------------------------------------------------------


def test_a_forged_or_early_timer_is_refused_and_may_come_again() -> None:
    h = Harness()
    h.schedule()
    due = next(t for t in due_timers(h.state) if t.kind == "schedule")
    early = timer_command(h.state, due, h.now)
    ev = h.apply(early)  # at h.now: 60 s before its time
    assert tokens(ev) == ["rejected:timer_stale"]
    assert "not due" in (ev[0].payload.detail or "")  # type: ignore[attr-defined]
    # another time than the state's, another revision, another schedule: stale
    for change in (
        {"payload": early.payload.model_copy(update={"due_at": due.due_at - 1})},
        {"generation": due.generation + 7},
        {"payload": early.payload.model_copy(update={"schedule_id": "ghost"})},
    ):
        h.now = due.due_at
        forged = early.model_copy(update={**change, "command_id": f"forged-{len(h.log)}"})
        assert tokens(h.apply(forged)) == ["rejected:timer_stale"]
    # a producer cannot send the processor's timer at all
    h.via = "producer"
    assert tokens(h.apply(early.model_copy(update={"command_id": "p1"}))) == [
        "rejected:not_allowed_here"
    ]
    h.via = "timer"
    # the refused early timer was not remembered: on time it decides
    assert tokens(h.apply(early, at=due.due_at)) == ["schedule.fired", "run.started:prompt"]
    # fired twice (a processor restart): a duplicate, nothing decided
    assert h.apply(early, at=due.due_at + 5) == []


@pytest.mark.parametrize(
    ("overlap", "want", "status"),
    [
        ("skip", ["schedule.fired"], "running"),
        ("reject", ["schedule.fired", "rejected:session_busy"], "running"),
        ("enqueue", ["schedule.fired", "run.queued"], "running"),
        ("interrupt", ["schedule.fired", "run.queued", "run.cancel_requested"], "cancelling"),
    ],
)
def test_each_overlap_policy_while_the_previous_run_is_running(
    overlap: str, want: list[str], status: str
) -> None:
    h = Harness()
    h.schedule(overlap=overlap)
    h.fire("schedule")  # starts the schedule's own first run...
    h.acquire("w1")  # ...which is still running at the next firing
    first = h.last_run
    ev = h.fire("schedule")
    assert tokens(ev) == want
    assert h.status == status and h.state.active and h.state.active.run_id == first
    fired = ev[0].payload_as(ScheduleFired)
    assert (fired.outcome, fired.reason) == (
        ("skipped", "busy") if overlap == "skip" else ("prompted", None)
    )
    for e in ev[1:]:
        actor = getattr(e.payload, "actor", None)
        assert actor in (None, "schedule:s1")
    if overlap in ("enqueue", "interrupt"):
        assert h.state.queue[0].actor == "schedule:s1"


def test_a_queued_firing_starts_when_the_run_ends() -> None:
    h = Harness()
    leased(h)
    h.schedule(overlap="enqueue")
    h.fire("schedule")
    ev = h.work("run.complete")
    assert tokens(ev)[-1] == "run.started:queued"
    assert ev[-1].payload_as(RunStarted).actor == "schedule:s1"


def down_for(h: Harness, minutes: int) -> list[str]:
    """The processor was down: the schedule's timer is decided `minutes` after its time."""
    due = next(t for t in due_timers(h.state) if t.kind == "schedule")
    h.now = due.due_at + minutes * MIN
    return tokens(h.apply(timer_command(h.state, due, h.now)))


def test_catch_up_once_fires_one_prompt_for_everything_missed() -> None:
    h = Harness()
    h.schedule(catch_up="once")
    assert down_for(h, 10) == ["schedule.fired", "run.started:prompt"]
    f = h.log[-2].payload_as(ScheduleFired)
    assert f.missed == 10 and f.next_nominal_at > h.now
    assert next(t for t in due_timers(h.state) if t.kind == "schedule").due_at > h.now


def test_catch_up_skip_fires_nothing_until_the_next_time_on_time() -> None:
    h = Harness()
    h.schedule(catch_up="skip")
    assert down_for(h, 10) == ["schedule.fired"]
    f = h.log[-1].payload_as(ScheduleFired)
    assert (f.outcome, f.reason, f.missed) == ("skipped", "late", 10)
    assert h.state.active is None
    assert tokens(h.fire("schedule")) == ["schedule.fired", "run.started:prompt"]


def test_catch_up_all_fires_the_oldest_missed_up_to_the_bound_then_skips() -> None:
    h = Harness()
    h.schedule(catch_up="all", max_catch_up=3, overlap="enqueue")
    assert down_for(h, 10) == ["schedule.fired", "run.started:prompt"]
    out = [tokens(h.fire("schedule")) for _ in range(3)]
    # each missed time is its own firing, due at once, each queued behind the first run
    assert out[:2] == [["schedule.fired", "run.queued"]] * 2
    assert out[2] == ["schedule.fired"]  # the bound: the rest is skipped, counted
    last = h.log[-1].payload_as(ScheduleFired)
    assert (last.outcome, last.reason, last.missed) == ("skipped", "late", 7)
    assert last.next_nominal_at > h.now
    assert len(h.state.queue) == 2


def test_a_late_firing_within_its_grace_is_on_time() -> None:
    h = Harness()
    h.schedule(catch_up="skip")
    due = next(t for t in due_timers(h.state) if t.kind == "schedule")
    h.now = due.due_at + 30_000  # a slow processor, not an outage
    assert tokens(h.apply(timer_command(h.state, due, h.now))) == [
        "schedule.fired",
        "run.started:prompt",
    ]


def test_jitter_is_within_bounds_and_the_same_on_every_replay() -> None:
    a, b = Harness(), Harness()
    for h in (a, b):
        h.schedule(cron="0 * * * *", jitter_ms=600_000)
    sa, sb = a.state.schedules[0], b.state.schedules[0]
    assert sa.next_at == sb.next_at
    assert 0 <= sa.next_at - sa.next_nominal_at <= 600_000
    offsets = set()
    for _ in range(5):
        ev = a.fire("schedule")
        f = ev[0].payload_as(ScheduleFired)
        offsets.add(f.next_at - f.next_nominal_at)
        a.abort()
    assert len(offsets) > 1  # not one fixed delay


def _last_start(h: Harness) -> Event:
    return [e for e in h.log if e.type == "run.started"][-1]


def test_each_run_a_schedule_starts_carries_its_labels() -> None:
    """The issue: a schedule's prompt is its text, policy and metadata. Labels given on the
    definition label every run it starts (as a prompt's `metadata` would), a queued firing
    keeps them until it starts, and an update's labels replace them."""
    h = Harness()
    h.schedule(metadata={"team": "growth", "kind": "digest"}, overlap="enqueue")
    h.fire("schedule")
    started = _last_start(h).payload_as(RunStarted)
    assert started.metadata == {"team": "growth", "kind": "digest"}
    assert started.actor == "schedule:s1"
    h.acquire("w1")
    h.fire("schedule")  # busy: queued, with its labels
    assert h.state.queue[0].metadata == {"team": "growth", "kind": "digest"}
    h.update_schedule(metadata={"team": "ops"}, overlap="enqueue")
    ev = h.work("run.complete")  # the queued firing starts with the labels it was queued with
    assert ev[-1].payload_as(RunStarted).metadata == {"team": "growth", "kind": "digest"}
    h.acquire("w2")
    assert tokens(h.work("run.complete", worker="w2"))[-1] == "run.finished:completed"
    h.fire("schedule")
    assert _last_start(h).payload_as(RunStarted).metadata == {"team": "ops"}


def test_a_schedules_labels_are_bounded_like_a_prompts() -> None:
    h = Harness()
    with pytest.raises(ValueError, match="metadata"):
        h.schedule(metadata={"bad key": "x"})
    with pytest.raises(ValueError, match="metadata"):
        h.schedule(metadata={f"k{i}": "v" for i in range(17)})
    assert h.state.schedules == ()


def test_the_state_record_keeps_the_schedules() -> None:
    h = Harness()
    running(h)
    h.schedule(
        "a",
        cron="30 9 * * mon-fri",
        timezone="Europe/Lisbon",
        input={"x": [1]},
        metadata={"team": "growth"},
    )
    h.schedule("b", overlap="interrupt", catch_up="all", max_catch_up=4, jitter_ms=500)
    assert decode_state(encode_state(h.state)) == h.state


def test_an_interrupting_firing_while_the_holder_is_gone_starts_at_once() -> None:
    """After a takeover's first half (the holder's lease expired, nobody holds the run), an
    `interrupt` firing cancels the unheld run at once and its prompt starts."""
    h = Harness()
    leased(h)
    h.fire("lease_expiry")
    h.schedule(overlap="interrupt")
    ev = h.fire("schedule")
    assert tokens(ev) == [
        "schedule.fired",
        "run.queued",
        "run.cancel_requested",
        "run.finished:cancelled",
        "run.started:queued",
    ]
    assert ev[-1].payload_as(RunStarted).actor == "schedule:s1"


def test_a_firing_is_never_due_again_at_its_own_time() -> None:
    """Whatever a firing decides, the schedule's next time is later: the processor's timer
    moves on (no firing loops on one instant)."""
    for kw in ({}, {"cron": "* * * * *"}, {"catch_up": "all", "max_catch_up": 1}):
        h = Harness()
        h.schedule(**kw)
        for _ in range(3):
            before = h.state.schedules[0].next_nominal_at
            down_for(h, 3)
            assert h.state.schedules[0].next_nominal_at > before
