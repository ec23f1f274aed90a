"""The processor's timer wheel: fire when due, once per refire window, again after an abort.

Expected outcomes come from the wheel's contract (sessionstream/runtimes/processor/timer_wheel.py
and
docs/protocol.md "Timers"): a deadline in the state is fired when the processor's clock
passes it, not before; a fired timer is not fired again inside `refire_ms` (its command is
on its way); it is fired again after that (the command may have been lost); `unfire` makes
a timer of an aborted transaction due at once; a session whose state no longer has the
deadline (the run finished) fires nothing.
"""

from __future__ import annotations

from sessionstream.core.state import SessionState
from sessionstream.core.timers import due_timers
from sessionstream.runtimes.processor.timer_wheel import TimerWheel
from tests.unit._harness import Harness, leased


def _leased(lease_ms: int = 10_000) -> Harness:
    h = Harness()
    h.prompt("p0")
    h.acquire("w1", lease_ms=lease_ms)
    return h


def _wheel_for(
    *harnesses: Harness, refire_ms: int = 5_000
) -> tuple[TimerWheel, dict[str, SessionState]]:
    wheel = TimerWheel(refire_ms=refire_ms)
    states = {h.session_id: h.state for h in harnesses}
    for s in states.values():
        wheel.schedule(s)
    return wheel, states


def _lease_due(h: Harness) -> int:
    (t,) = [t for t in due_timers(h.state) if t.kind == "lease_expiry"]
    return t.due_at


def test_nothing_fires_before_its_deadline_and_it_fires_when_due() -> None:
    h = _leased()
    wheel, states = _wheel_for(h)
    due = _lease_due(h)
    assert wheel.due(due - 1, states.get) == []
    fired = wheel.due(due, states.get)
    assert [c.payload.kind for c in fired] == ["lease_expiry"]  # type: ignore[union-attr]
    assert fired[0].type == "timer.fired"
    assert fired[0].run_id == h.state.active.run_id  # type: ignore[union-attr]
    assert fired[0].generation == h.generation


def test_a_fired_timer_is_not_fired_again_inside_the_refire_window() -> None:
    h = _leased()
    wheel, states = _wheel_for(h, refire_ms=5_000)
    due = _lease_due(h)
    first = wheel.due(due, states.get)
    assert len(first) == 1
    # the state did not change (the command is on its way): re-scheduling must not refire
    wheel.schedule(h.state)
    assert wheel.due(due + 1, states.get) == []
    assert wheel.due(due + 4_999, states.get) == []


def test_a_timer_decided_as_not_due_fires_again_after_the_window() -> None:
    # the processor's clock ran ahead of the log's: the decider rejects the timer as not due
    # (by the log time it was appended at), the session's state changes (the rejection is an
    # event) and is scheduled again; the wheel fires it again once the window has passed
    h = _leased()
    wheel, states = _wheel_for(h, refire_ms=5_000)
    due = _lease_due(h)
    (first,) = wheel.due(due, states.get)
    events = h.apply(first, at=due - 100)
    assert [e.type for e in events] == ["command.rejected"]
    states[h.session_id] = h.state
    wheel.schedule(h.state)
    assert wheel.due(due + 4_999, states.get) == []
    (again,) = wheel.due(due + 5_000, states.get)
    # the same timer: the same command id, so the decider sees a duplicate if both arrive
    assert again.command_id == first.command_id
    assert [e.type for e in h.apply(again, at=due + 5_000)] == ["run.lease_expired"]


def test_unfire_makes_an_aborted_transactions_timer_due_at_once() -> None:
    h = _leased()
    wheel, states = _wheel_for(h, refire_ms=5_000)
    due = _lease_due(h)
    (cmd,) = wheel.due(due, states.get)
    wheel.unfire(cmd, h.state)
    (again,) = wheel.due(due + 1, states.get)
    assert again.command_id == cmd.command_id


def test_a_deadline_that_left_the_state_fires_nothing() -> None:
    h = _leased()
    wheel, states = _wheel_for(h)
    due = _lease_due(h)
    run_deadline = max(t.due_at for t in due_timers(h.state))
    h.work("run.complete", {"result": "done"})
    assert h.state.active is None
    states[h.session_id] = h.state
    assert wheel.due(max(due, run_deadline) + 1, states.get) == []
    assert wheel.pending == 0


def test_a_session_that_is_gone_fires_nothing() -> None:
    h = _leased()
    wheel, _ = _wheel_for(h)
    assert wheel.due(_lease_due(h) + 1, lambda sid: None) == []


def test_a_renewed_lease_fires_at_its_new_deadline_not_the_old_one() -> None:
    h = _leased(lease_ms=10_000)
    wheel, states = _wheel_for(h)
    old = _lease_due(h)
    h.now += 5_000
    h.work("lease.renew", {"lease_ms": 10_000})
    new = _lease_due(h)
    assert new > old
    states[h.session_id] = h.state
    wheel.schedule(h.state)
    assert wheel.due(old, states.get) == []
    assert [c.payload.due_at for c in wheel.due(new, states.get)] == [new]  # type: ignore[union-attr]


def test_each_session_fires_its_own_timers_in_deadline_order() -> None:
    a, b = Harness(session_id="s-a"), Harness(session_id="s-b")
    leased(a)
    b.now = a.now + 1_000
    leased(b)
    wheel, states = _wheel_for(a, b)
    late = max(_lease_due(a), _lease_due(b))
    fired = wheel.due(late, states.get)
    assert [c.session_id for c in fired if c.payload.kind == "lease_expiry"] == ["s-a", "s-b"]  # type: ignore[union-attr]


class _Counting:
    """`state_of` that counts how often the wheel looks a session up."""

    def __init__(self, states: dict[str, SessionState]) -> None:
        self.states, self.calls = states, 0

    def __call__(self, sid: str) -> SessionState | None:
        self.calls += 1
        return self.states.get(sid)


def test_a_session_scheduled_many_times_is_looked_at_once_when_due() -> None:
    # every state change schedules its session: a busy run's thousand changes must not
    # leave a thousand entries that are each looked at (and pushed again) when due
    h = _leased()
    wheel, states = _wheel_for(h)
    for _ in range(1_000):
        wheel.schedule(h.state)
    assert wheel.pending == 1
    look = _Counting(states)
    due = _lease_due(h)
    assert len(wheel.due(due, look)) == 1
    assert look.calls == 1


def test_renewals_keep_one_entry_and_each_deadline_costs_one_look() -> None:
    h = _leased(lease_ms=10_000)
    wheel, states = _wheel_for(h)
    look = _Counting(states)
    for _ in range(50):  # renewed every 5 s, with 10 progress changes in between
        old = _lease_due(h)
        h.now += 5_000
        h.work("lease.renew", {"lease_ms": 10_000})
        states[h.session_id] = h.state
        for _ in range(10):
            wheel.schedule(h.state)
        assert wheel.due(old, look) == []  # looked at, nothing due: the new deadline is later
    assert look.calls <= 50
    assert wheel.pending == 1
    assert [c.payload.due_at for c in wheel.due(_lease_due(h), look)] == [_lease_due(h)]  # type: ignore[union-attr]


def test_a_fired_timer_whose_command_was_lost_fires_again_without_a_state_change() -> None:
    # the transaction that carried it committed nothing the session saw (or the command is
    # still on its way): no state change schedules the session, the wheel itself comes back
    h = _leased()
    wheel, states = _wheel_for(h, refire_ms=5_000)
    due = _lease_due(h)
    (first,) = wheel.due(due, states.get)
    assert wheel.due(due + 4_999, states.get) == []
    (again,) = wheel.due(due + 5_000, states.get)
    assert again.command_id == first.command_id
    assert wheel.pending == 1  # and again after the next window, until decided


def test_an_earlier_deadline_after_a_later_one_is_not_missed() -> None:
    # the session was watched for its run deadline; a lease (earlier) comes with a change
    h = Harness()
    h.prompt("p0")
    wheel, states = _wheel_for(h)
    h.acquire("w1", lease_ms=1_000)
    states[h.session_id] = h.state
    wheel.schedule(h.state)
    due = _lease_due(h)
    assert [c.payload.kind for c in wheel.due(due, states.get)] == ["lease_expiry"]  # type: ignore[union-attr]
