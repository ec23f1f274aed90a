"""Durable steps (docs/protocol.md#durable-steps): recorded once by the current holder,
handed to every new holder with the run's latest checkpoint, and held within bounds.

The reference model (`_model.LogModel`) checks every log here (through `Harness`); the last
tests show it refuses logs that break the rules, so its checks are not vacuous.
"""

from __future__ import annotations

from typing import Any

import pytest

from sessionstream.core.open_runs import open_run
from sessionstream.schemas.commands import LATEST_CHECKPOINT_REF
from sessionstream.schemas.events import Event, LeaseGranted, RunStarted, StepDelivered
from tests.unit._harness import Harness, leased, tokens
from tests.unit._model import LogModel


def record(h: Harness, step_id: str, result: str | None = '"ok"', **kw: Any) -> list[Event]:
    payload = {"step_id": step_id, "kind": "model", "result": result, **kw}
    return h.work("step.record", payload, worker=_holder(h))


def _holder(h: Harness) -> str:
    assert h.state.active is not None and h.state.active.lease_owner is not None
    return h.state.active.lease_owner


def test_a_takeover_gets_every_step_and_the_latest_checkpoint_after_the_inputs() -> None:
    h = Harness()
    leased(h)
    h.steer("s1")
    record(h, "model-1", '"plan: fly"', name="gpt", input_digest="d1", input='"find"')
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck/1"})
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck/2"})
    record(h, "tool:search-1", None, kind="tool", result_ref="s3://steps/big")
    h.fire("lease_expiry")
    events = h.acquire("w2")
    assert tokens(events) == [
        "run.lease_granted",
        "run.input_delivered",
        "step.delivered",
        "step.delivered",
    ]
    grant = events[0].payload_as(LeaseGranted)
    assert (grant.checkpoint_ref, grant.steps_delivered) == ("s3://ck/2", 2)
    first, second = (e.payload_as(StepDelivered) for e in events[2:])
    assert (first.step_id, first.result, first.name, first.input_digest, first.generation) == (
        "model-1",
        '"plan: fly"',
        "gpt",
        "d1",
        1,
    )
    assert (second.step_id, second.kind, second.result, second.result_ref) == (
        "tool:search-1",
        "tool",
        None,
        "s3://steps/big",
    )
    assert events[0].generation == 2


def test_the_open_run_record_names_the_checkpoint() -> None:
    h = Harness()
    leased(h)
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck/9"})
    h.work("lease.release")
    opened = open_run(h.state)
    assert opened is not None and opened.checkpoint_ref == "s3://ck/9"


def test_a_grant_before_any_step_delivers_nothing() -> None:
    h = Harness()
    h.prompt("p")
    events = h.acquire("w1")
    assert tokens(events) == ["run.lease_granted"]
    grant = events[0].payload_as(LeaseGranted)
    assert (grant.checkpoint_ref, grant.steps_delivered) == (None, 0)


def test_the_first_record_stands_across_generations() -> None:
    h = Harness()
    leased(h)
    record(h, "model-1", '"first"')
    h.work("lease.release")
    h.acquire("w2")
    events = record(h, "model-1", '"second"')
    assert tokens(events) == ["rejected:step_already_recorded"]
    assert h.state.active is not None
    assert [(s.step_id, s.result, s.generation) for s in h.state.active.steps] == [
        ("model-1", '"first"', 1)
    ]


def test_a_fenced_holders_step_is_never_recorded_nor_delivered() -> None:
    h = Harness()
    leased(h)
    h.fire("lease_expiry")
    events = h.work("step.record", {"step_id": "m", "kind": "model", "result": "1"}, generation=1)
    assert tokens(events) == ["rejected:stale_generation", "run.stale_write_recorded"]
    assert tokens(h.acquire("w2")) == ["run.lease_granted"]


def test_steps_leave_the_state_with_their_run() -> None:
    h = Harness()
    leased(h)
    record(h, "model-1")
    h.work("run.complete", {"result": "done"})
    h.prompt("next")
    assert h.state.active is not None and h.state.active.steps == ()
    assert h.state.active.checkpoint_ref is None


def test_a_record_with_a_result_and_a_pointer_is_a_schema_violation() -> None:
    h = Harness()
    with pytest.raises(ValueError, match="result or resultRef"):
        h.command("step.record", {"step_id": "s", "kind": "tool", "result": "1", "result_ref": "x"})


def test_the_limit_is_named_in_the_rejection() -> None:
    h = Harness()
    leased(h)
    events = record(h, "big", '"' + "x" * 9000 + '"')
    assert tokens(events) == ["rejected:step_too_large"]
    assert "maxStepResultBytes 8192" in (events[0].payload.detail or "")  # type: ignore[attr-defined]


# -- the reference model refuses logs that break the rules --------------------------------------


def _log_of_takeover() -> list[list[Event]]:
    h = Harness()
    leased(h)
    record(h, "a", '"1"')
    record(h, "b", '"2"')
    h.work("lease.release")
    h.acquire("w2")
    groups: list[list[Event]] = []
    for e in h.log:
        if groups and groups[-1][0].command_id == e.command_id:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def _feed(groups: list[list[Event]]) -> None:
    model = LogModel()
    for g in groups:
        model.feed(g)


def _replace(e: Event, **payload: Any) -> Event:
    return e.model_copy(update={"payload": e.payload.model_copy(update=payload)})


def test_the_model_accepts_the_decider_log() -> None:
    _feed(_log_of_takeover())


def test_the_model_refuses_steps_delivered_out_of_order() -> None:
    groups = _log_of_takeover()
    grant = groups[-1]
    a, b = grant[1], grant[2]
    grant[1:3] = [b.model_copy(update={"seq": a.seq}), a.model_copy(update={"seq": b.seq})]
    with pytest.raises(AssertionError, match="record order"):
        _feed(groups)


def test_the_model_refuses_a_step_delivered_with_another_result() -> None:
    groups = _log_of_takeover()
    groups[-1][1] = _replace(groups[-1][1], result='"forged"')
    with pytest.raises(AssertionError, match="handed over as"):
        _feed(groups)


def test_the_model_refuses_a_grant_that_drops_a_step() -> None:
    groups = _log_of_takeover()
    del groups[-1][2]
    with pytest.raises(AssertionError, match="never handed over"):
        _feed(groups)


def test_the_model_refuses_a_step_recorded_twice() -> None:
    groups = _log_of_takeover()
    second = groups[3][0]
    assert second.type == "step.recorded"
    groups[3][0] = _replace(second, step_id="a")
    with pytest.raises(AssertionError, match="recorded twice"):
        _feed(groups)


def test_the_model_refuses_a_step_recorded_by_another_worker() -> None:
    groups = _log_of_takeover()
    groups[2][0] = _replace(groups[2][0], worker_id="w9")
    with pytest.raises(AssertionError, match="the holder is"):
        _feed(groups)


def test_the_model_refuses_a_grant_naming_another_checkpoint() -> None:
    groups = _log_of_takeover()
    groups[-1][0] = _replace(groups[-1][0], checkpoint_ref="s3://elsewhere")
    with pytest.raises(AssertionError, match="another checkpoint"):
        _feed(groups)


# -- the session's next run, from the latest checkpoint, if asked ----------------------------------


def test_a_prompt_asking_for_the_latest_checkpoint_starts_from_it() -> None:
    h = Harness()
    leased(h)
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck/a"})
    h.work("run.complete", {"result": "done"})
    events = h.do("prompt", {"text": "go on", "context_ref": LATEST_CHECKPOINT_REF})
    started = events[0].payload_as(RunStarted)
    assert (started.context_ref, started.from_checkpoint) == ("s3://ck/a", True)
    # a prompt that names its own context keeps it
    h.acquire("w1")
    h.work("run.complete", {"result": "done"})
    started = h.do("prompt", {"text": "x", "context_ref": "s3://mine"})[0].payload_as(RunStarted)
    assert (started.context_ref, started.from_checkpoint) == ("s3://mine", False)


def test_without_a_checkpoint_the_run_starts_from_none() -> None:
    h = Harness()
    events = h.do("prompt", {"text": "go", "context_ref": LATEST_CHECKPOINT_REF})
    started = events[0].payload_as(RunStarted)
    assert (started.context_ref, started.from_checkpoint) == (None, True)


def test_a_queued_task_gets_the_checkpoint_written_after_it_was_queued() -> None:
    h = Harness()
    leased(h)
    h.do("prompt", {"text": "next", "policy": "enqueue", "context_ref": LATEST_CHECKPOINT_REF})
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck/later"})
    events = h.work("run.complete", {"result": "done"})
    started = next(e for e in events if e.type == "run.started").payload_as(RunStarted)
    assert (started.context_ref, started.from_checkpoint) == ("s3://ck/later", True)


def test_the_model_refuses_a_run_started_from_another_checkpoint() -> None:
    h = Harness()
    leased(h)
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck/a"})
    h.work("run.complete", {"result": "done"})
    h.do("prompt", {"text": "go on", "context_ref": LATEST_CHECKPOINT_REF})
    groups: list[list[Event]] = []
    for e in h.log:
        if groups and groups[-1][0].command_id == e.command_id:
            groups[-1].append(e)
        else:
            groups.append([e])
    groups[-1][0] = _replace(groups[-1][0], context_ref="s3://ck/old")
    with pytest.raises(AssertionError, match="latest checkpoint"):
        _feed(groups)
