"""The schedule routes' bodies: a definition becomes the command body the command route
takes; the path's schedule id wins over none and refuses another; and the list view."""

from __future__ import annotations

import pytest

from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.schedules import _body
from sessionstream.apps.gateway.views import schedule_json
from sessionstream.core.state import Schedule


def test_a_definition_and_its_command_id_become_a_command_body() -> None:
    body = _body({"scheduleId": "d", "cron": "0 9 * * *", "text": "t", "commandId": "x1"})
    assert body == {
        "payload": {"scheduleId": "d", "cron": "0 9 * * *", "text": "t"},
        "commandId": "x1",
    }
    assert _body({"intervalMs": 60_000, "text": "t"}, "d")["payload"]["scheduleId"] == "d"


@pytest.mark.parametrize("raw", [[], "x", None, 3])
def test_a_body_that_is_no_object_is_a_400(raw: object) -> None:
    with pytest.raises(ApiError) as e:
        _body(raw)
    assert e.value.status == 400


def test_another_schedule_id_than_the_paths_is_a_400() -> None:
    with pytest.raises(ApiError) as e:
        _body({"scheduleId": "other", "intervalMs": 60_000, "text": "t"}, "d")
    assert e.value.status == 400 and "path" in str(e.value)


def test_the_list_shows_the_next_firing_and_the_input_as_json() -> None:
    sc = Schedule(
        schedule_id="d",
        revision=3,
        interval_ms=60_000,
        text="t",
        input_json='{"a":[1]}',
        next_nominal_at=5,
        next_at=7,
        actor="user:ana",
    )
    got = schedule_json(sc)
    assert (got["nextAt"], got["nextNominalAt"], got["input"], got["timezone"]) == (
        7,
        5,
        {"a": [1]},
        None,
    )
    assert got["createdBy"] == "user:ana" and got["revision"] == 3
