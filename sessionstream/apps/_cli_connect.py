"""`sessionstream connect`: the run stream into PostgreSQL with Kafka Connect."""

from __future__ import annotations

import json
import time
from typing import Annotated, NoReturn

import typer

from sessionstream.errors import SessionstreamError
from sessionstream.settings import get_settings

__all__ = ["register"]

connect_app = typer.Typer(
    help="Land session.events in PostgreSQL with Kafka Connect (`make connect` starts a "
    "worker; docs/analytics.md).",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Option("--name", help="connector name")]
Table = Annotated[str, typer.Option("--table", help="schema.table the events land in")]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


@connect_app.command("config")
def config(
    table: Table = "analytics.run_events",
    start: Annotated[
        str, typer.Option(help="earliest|latest: where a new connector starts")
    ] = "earliest",
) -> None:
    """Print the JDBC sink connector's configuration for these settings (JSON)."""
    from sessionstream.adapters.connect import connector_config

    try:
        typer.echo(json.dumps(connector_config(get_settings(), table=table, start=start), indent=2))
    except SessionstreamError as e:
        _fail(str(e))


@connect_app.command("deploy")
def deploy(
    name: Name = "sessionstream-analytics-events",
    table: Table = "analytics.run_events",
    start: Annotated[
        str, typer.Option(help="earliest|latest: where a new connector starts")
    ] = "earliest",
    wait: Annotated[float, typer.Option(help="seconds to wait for its task to run")] = 60.0,
) -> None:
    """Create or update the connector on SESSIONSTREAM_CONNECT_URL and wait until its task
    runs; non-zero exit when it fails (with the task's reason)."""
    from sessionstream.adapters import connect

    s = get_settings()
    try:
        config = connect.connector_config(s, table=table, start=start)
        if start == "earliest" and not _exists(s.connect_url, name):
            skipped = connect.start_past_old_framing(s, name)
            for p, (first, low) in sorted(skipped.items()):
                typer.echo(
                    f"{s.events_topic}[{p}]: starts at offset {first}: offsets {low}..{first - 1}"
                    " are in the single-object framing written before the schema registry,"
                    " which Kafka Connect's converter cannot read (they are in PostgreSQL's"
                    " projection; docs/analytics.md)",
                    err=True,
                )
        connect.deploy(s.connect_url, name, config)
        deadline = time.monotonic() + wait
        while True:
            st = connect.status(s.connect_url, name) if _exists(s.connect_url, name) else None
            tasks = (st or {}).get("tasks", [])
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed:
                _fail(f"connector {name}: task failed:\n{failed[0].get('trace', '')[:3000]}")
            if tasks and all(t.get("state") == "RUNNING" for t in tasks):
                typer.echo(
                    f"connector {name}: running on {s.connect_url}: {s.events_topic} -> {table}"
                )
                return
            if time.monotonic() > deadline:
                _fail(f"connector {name}: its task is not running after {wait:.0f}s: {st}")
            time.sleep(0.5)
    except SessionstreamError as e:
        _fail(str(e))


def _exists(url: str, name: str) -> bool:
    from sessionstream.adapters.connect import ConnectError, status

    try:
        status(url, name)
    except ConnectError as e:
        if "HTTP 404" in str(e):
            return False
        raise
    return True


@connect_app.command("status")
def show_status(name: Name = "sessionstream-analytics-events") -> None:
    """The connector's and its tasks' states (a failed task's reason too), as JSON;
    non-zero exit when a task failed."""
    from sessionstream.adapters.connect import status

    try:
        st = status(get_settings().connect_url, name)
    except SessionstreamError as e:
        _fail(str(e))
    typer.echo(json.dumps(st, indent=2))
    if any(t.get("state") == "FAILED" for t in st.get("tasks", [])):
        raise typer.Exit(code=1)


@connect_app.command("delete")
def remove(name: Name = "sessionstream-analytics-events") -> None:
    """Delete the connector (the table and its rows stay)."""
    from sessionstream.adapters.connect import delete

    try:
        delete(get_settings().connect_url, name)
    except SessionstreamError as e:
        _fail(str(e))
    typer.echo(f"connector {name}: deleted")


def register(app: typer.Typer) -> None:
    app.add_typer(connect_app, name="connect")
