"""`sessionstream schedules`: a session's schedules listed with their next firing, and
created, replaced and deleted as `schedule.*` commands (docs/protocol.md#schedules)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any

import typer
from rich.console import Console

from sessionstream.apps._cli_send import (
    Actor,
    AsJson,
    CommandId,
    Session,
    Tenant,
    Wait,
    _labels,
    _submit,
)
from sessionstream.settings import get_settings

__all__ = ["register"]

console = Console()

ScheduleId = Annotated[
    str, typer.Argument(help="the schedule's id in the session (letters, digits, . _ -)")
]
Text = Annotated[str, typer.Argument(help="the prompt each firing sends")]
Cron = Annotated[
    str | None,
    typer.Option(
        help="five fields: minute hour day-of-month month day-of-week (ranges, steps, lists, "
        "jan-dec, sun-sat)"
    ),
]
Tz = Annotated[str, typer.Option("--tz", help="IANA time zone the cron is read in")]
IntervalMs = Annotated[
    int | None,
    typer.Option(help="fire every N ms instead of a cron (at least the setting's least)"),
]
Overlap = Annotated[
    str, typer.Option(help="while a run is active: skip, reject, enqueue, interrupt")
]
CatchUp = Annotated[
    str, typer.Option(help="after downtime: once (one prompt), all (each missed), skip")
]
MaxCatchUp = Annotated[int, typer.Option(help="catch-up all: at most this many late prompts")]
JitterMs = Annotated[int, typer.Option(help="delay each firing by up to N ms (deterministic)")]
TimeoutMs = Annotated[int | None, typer.Option(help="each run's deadline in ms")]
InputJson = Annotated[
    str | None, typer.Option("--input", metavar="JSON", help="the prompt's typed input (JSON)")
]
LabelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        metavar="KEY=VALUE",
        help="a label of each run it starts (repeat for more; as `prompt --label`)",
    ),
]


def _definition(
    schedule_id: str,
    text: str,
    cron: str | None,
    tz: str,
    interval_ms: int | None,
    overlap: str,
    catch_up: str,
    max_catch_up: int,
    jitter_ms: int,
    timeout_ms: int | None,
    input_json: str | None,
    labels: list[str] | None = None,
) -> dict[str, Any]:
    if (cron is None) == (interval_ms is None):
        typer.echo("error: give exactly one of --cron and --interval-ms", err=True)
        raise typer.Exit(code=2)
    payload: dict[str, Any] = {
        "scheduleId": schedule_id,
        "text": text,
        "overlap": overlap,
        "catchUp": catch_up,
        "maxCatchUp": max_catch_up,
        "jitterMs": jitter_ms,
    }
    if cron is not None:
        payload |= {"cron": cron, "timezone": tz}
    else:
        payload["intervalMs"] = interval_ms
    if timeout_ms:
        payload["timeoutMs"] = timeout_ms
    if labels:
        payload["metadata"] = _labels(labels)
    if input_json is not None:
        try:
            payload["input"] = json.loads(input_json)
        except ValueError as e:
            typer.echo(f"error: --input is not JSON: {e}", err=True)
            raise typer.Exit(code=2) from e
    return payload


def create(
    session: Session,
    schedule_id: ScheduleId,
    text: Text,
    cron: Cron = None,
    tz: Tz = "UTC",
    interval_ms: IntervalMs = None,
    overlap: Overlap = "skip",
    catch_up: CatchUp = "once",
    max_catch_up: MaxCatchUp = 10,
    jitter_ms: JitterMs = 0,
    timeout_ms: TimeoutMs = None,
    input_json: InputJson = None,
    labels: LabelOpt = None,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Create a schedule in SESSION: TEXT sent as a prompt on a cron (in --tz) or every
    --interval-ms; the processor fires it on the log's clock."""
    payload = _definition(
        schedule_id,
        text,
        cron,
        tz,
        interval_ms,
        overlap,
        catch_up,
        max_catch_up,
        jitter_ms,
        timeout_ms,
        input_json,
        labels,
    )
    _submit(session, "schedule.create", payload, tenant, wait, as_json, command_id, actor)


def update(
    session: Session,
    schedule_id: ScheduleId,
    text: Text,
    cron: Cron = None,
    tz: Tz = "UTC",
    interval_ms: IntervalMs = None,
    overlap: Overlap = "skip",
    catch_up: CatchUp = "once",
    max_catch_up: MaxCatchUp = 10,
    jitter_ms: JitterMs = 0,
    timeout_ms: TimeoutMs = None,
    input_json: InputJson = None,
    labels: LabelOpt = None,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Replace a schedule's whole definition; its next firing is computed again from now."""
    payload = _definition(
        schedule_id,
        text,
        cron,
        tz,
        interval_ms,
        overlap,
        catch_up,
        max_catch_up,
        jitter_ms,
        timeout_ms,
        input_json,
        labels,
    )
    _submit(session, "schedule.update", payload, tenant, wait, as_json, command_id, actor)


def delete(
    session: Session,
    schedule_id: ScheduleId,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Delete a schedule; a firing already on its way is refused."""
    payload = {"scheduleId": schedule_id}
    _submit(session, "schedule.delete", payload, tenant, wait, as_json, command_id, actor)


def list_(
    session: Session,
    tenant: Tenant = "default",
    as_json: AsJson = False,
) -> None:
    """SESSION's schedules and their next firing, as PostgreSQL last saw the log."""
    from sessionstream.adapters.postgres import connect, translated
    from sessionstream.apps.gateway.schedules import schedules_of
    from sessionstream.apps.gateway.views import schedule_json
    from sessionstream.errors import DatabaseError

    settings = get_settings()
    try:
        with translated(settings.database_conninfo, queries=True), connect(settings) as conn:
            found = schedules_of(conn, session, tenant)
    except DatabaseError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from e
    if found is None:
        typer.echo(f"error: {session!r} is not a session of tenant {tenant!r}", err=True)
        raise typer.Exit(code=1)
    rows = [schedule_json(sc) for sc in found]
    if as_json:
        typer.echo(json.dumps({"sessionId": session, "schedules": rows}))
        return
    if not rows:
        console.print(f"no schedules in {session}", highlight=False)
    for r in rows:
        when = (
            r["cron"] and f"cron {r['cron']!r} {r['timezone']}"
        ) or f"every {r['intervalMs']} ms"
        nxt = dt.datetime.fromtimestamp(r["nextAt"] / 1000, dt.UTC).isoformat(timespec="seconds")
        console.print(
            f"{r['scheduleId']}: {when}, overlap {r['overlap']}, catch-up {r['catchUp']}, "
            f"next {nxt} — {r['text'][:60]!r}",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="A session's schedules: prompts sent on a cron or an interval by the processor.",
        no_args_is_help=True,
    )
    sub.command("create")(create)
    sub.command("update")(update)
    sub.command("delete")(delete)
    sub.command("list")(list_)
    app.add_typer(sub, name="schedules")
