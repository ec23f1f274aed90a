"""`sessionstream schedules ...` and `SessionClient.schedule_*`: the command each builds,
and the definitions refused before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from sessionstream._client_commands import ProducerCommands
from sessionstream.apps.cli import app
from sessionstream.schemas.commands import Command


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "give exactly one of --cron and --interval-ms"),
        (["--cron", "* * * * *", "--interval-ms", "60000"], "give exactly one of"),
        (["--interval-ms", "60000", "--input", "{no json"], "--input is not JSON"),
    ],
    ids=["neither", "both", "bad input"],
)
def test_a_definition_the_cli_cannot_send_stops_it(
    args: list[str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:9")  # never reached
    done = CliRunner().invoke(app, ["schedules", "create", "acme:s1", "daily", "report", *args])
    assert done.exit_code == 2, done.output
    assert says in done.output, done.output


def test_the_cli_lists_its_schedule_commands() -> None:
    done = CliRunner().invoke(app, ["schedules", "--help"])
    assert done.exit_code == 0
    for sub in ("create", "update", "delete", "list"):
        assert sub in done.output


class _Recorder(ProducerCommands):
    """The client's named commands, recording what they would submit."""

    def __init__(self) -> None:
        self.sent: list[Command] = []

    def command(self, session_id: str, type_: str, payload: Any, **fields: Any) -> Command:
        return Command(
            command_id=fields.pop("command_id", "c1"),
            session_id=session_id,
            tenant_id="acme",
            type=type_,
            ts=1,
            payload=payload,
            **fields,
        )

    def submit(self, command: Command, *, track: bool = True) -> Any:
        self.sent.append(command)
        return command


def test_the_clients_schedule_commands() -> None:
    c = _Recorder()
    c.schedule_create(
        "acme:s1", "daily", "report", cron="0 9 * * *", timezone="Europe/Lisbon", input={"a": 1}
    )
    c.schedule_update("acme:s1", "daily", "hourly", interval_ms=3_600_000, command_id="u1")
    c.schedule_delete("acme:s1", "daily")
    made = [(x.type, x.command_id, x.payload.model_dump(exclude_defaults=True)) for x in c.sent]
    assert made == [
        (
            "schedule.create",
            "c1",
            {
                "schedule_id": "daily",
                "cron": "0 9 * * *",
                "timezone": "Europe/Lisbon",
                "text": "report",
                "input": {"a": 1},
            },
        ),
        (
            "schedule.update",
            "u1",
            {"schedule_id": "daily", "interval_ms": 3_600_000, "text": "hourly"},
        ),
        ("schedule.delete", "c1", {"schedule_id": "daily"}),
    ]
