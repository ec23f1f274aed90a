"""CLI commands that write to sessions (prompt, steer, follow-up, send, abort, dequeue,
clear-queue) and tail them."""

from __future__ import annotations

import getpass
import json
import uuid
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from sessionstream.adapters.registry import reader_codec
from sessionstream.errors import CommandTimeout, SessionstreamError
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import Event
from sessionstream.settings import get_settings

__all__ = ["register"]

console = Console()

Tenant = Annotated[str, typer.Option(help="tenant the session belongs to")]
Session = Annotated[
    str,
    typer.Argument(
        help="the session's full id: TENANT:ID is the session the gateway shows tenant "
        "TENANT's keys as ID (an id without ':' is unscoped)",
        show_default=False,
    ),
]
Wait = Annotated[float, typer.Option(help="seconds to wait for the outcome (0: don't wait)")]
AsJson = Annotated[bool, typer.Option("--json", help="print the outcome as JSON")]
CommandId = Annotated[
    str | None, typer.Option(help="idempotency key (default: a new uuid); resend to retry")
]
Actor = Annotated[
    str | None, typer.Option(help="who asks, recorded on the events (default: cli:$USER)")
]
Run = Annotated[
    str | None,
    typer.Option(
        "--run",
        help="the run meant (default: the session's active run as PostgreSQL last saw it)",
    ),
]
AnyRun = Annotated[
    bool, typer.Option("--any", help="session-scoped: whichever run is active when it lands")
]


def _default_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _run_seen(session: str, *, latest: bool) -> str | None:
    """The session's active run in the projection (the sink's view, a moment behind the
    log); with `latest`, the most recent run when none is active, so that a command for a
    run that has ended is refused `run_not_active` rather than landing on a newer one."""
    from sessionstream.adapters.postgres import connect, translated
    from sessionstream.errors import DatabaseError, QueryFailed

    settings = get_settings()
    try:
        with translated(settings.database_conninfo, queries=True), connect(settings) as conn:
            row = conn.execute(
                "select active_run_id from agent_sessions where session_id = %s", (session,)
            ).fetchone()
            if row is not None and row[0] is not None:
                return str(row[0])
            if not latest:
                return None
            row = conn.execute(
                "select run_id from agent_runs where session_id = %s"
                " order by created_at desc, run_id limit 1",
                (session,),
            ).fetchone()
            return None if row is None else str(row[0])
    except DatabaseError as e:
        # a refused statement in the driver's own words, without the sqlstate prefix
        why = e.reason if isinstance(e, QueryFailed) else str(e)
        typer.echo(
            f"error: cannot look up the active run of {session!r} in PostgreSQL ({why}); "
            "name it with --run RUN_ID, or send it session-scoped with --any",
            err=True,
        )
        raise typer.Exit(code=2) from e


def _target(session: str, run: str | None, any_run: bool, *, latest: bool) -> str | None:
    if run is not None and any_run:
        typer.echo("error: --run and --any exclude each other", err=True)
        raise typer.Exit(code=2)
    if any_run:
        return None
    return run if run is not None else _run_seen(session, latest=latest)


def _submit(
    session: str,
    type_: str,
    payload: dict[str, Any],
    tenant: str,
    wait: float,
    as_json: bool,
    command_id: str | None,
    actor: str | None,
    run_id: str | None = None,
) -> None:
    from sessionstream.client import SessionClient

    try:
        with SessionClient(tenant, get_settings(), actor=actor or _default_actor()) as client:
            cmd = client.command(
                session,
                type_,
                payload,
                command_id=command_id or str(uuid.uuid4()),
                run_id=run_id,
            )
            handle = client.submit(cmd, track=wait > 0)
            if wait <= 0:
                client.flush()
                _out(as_json, {"commandId": cmd.command_id, "status": "sent"})
                return
            outcome = client.wait(handle, timeout=wait)
    except ValidationError as e:  # e.g. an --input JSON has no place for (NaN, too deep)
        first = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"])
        typer.echo(f"error: the {type_} is not valid: {where}: {first['msg']}", err=True)
        raise typer.Exit(code=2) from e
    except CommandTimeout as e:
        typer.echo(f"error: {e} (is `sessionstream processor` running?)", err=True)
        raise typer.Exit(code=2) from e
    except SessionstreamError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from e
    result = {
        "commandId": cmd.command_id,
        "status": outcome.status,
        "runId": outcome.run_id,
        "reason": outcome.reason,
        "events": [e.type for e in outcome.events],
    }
    _out(as_json, result)
    if outcome.status in ("rejected", "dead_letter"):
        raise typer.Exit(code=1)


def _out(as_json: bool, result: dict[str, Any]) -> None:
    if as_json:
        typer.echo(json.dumps(result))
        return
    status = result["status"]
    color = {
        "accepted": "green",
        "rejected": "red",
        "duplicate": "yellow",
        "dead_letter": "red",
    }.get(status, "white")
    line = f"[{color}]{status}[/{color}] command {result['commandId']}"
    if result.get("runId"):
        line += f" run {result['runId']}"
    if result.get("reason"):
        line += f" reason {result['reason']}"
    if result.get("events"):
        line += f" -> {', '.join(result['events'])}"
    console.print(line, highlight=False)


def prompt(
    session: Session,
    text: str,
    tenant: Tenant = "default",
    policy: Annotated[
        str, typer.Option(help="while a run is active: reject, enqueue, interrupt")
    ] = "reject",
    timeout_ms: Annotated[int | None, typer.Option(help="run deadline in ms")] = None,
    retry_of: Annotated[
        str | None, typer.Option(help="the run (timed out, or failed retryable) this retries")
    ] = None,
    input_json: Annotated[
        str | None,
        typer.Option(
            "--input",
            metavar="JSON",
            help="the task's typed input, a JSON value (the agent validates it against the "
            "type its handler declares)",
        ),
    ] = None,
    labels: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            metavar="KEY=VALUE",
            help="a label of the run (repeat for more; at most 16, keys of A-Za-z0-9._/-); "
            "find its runs with `runs list --label KEY:VALUE`",
        ),
    ] = None,
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Start a new task in SESSION (policy says what happens while a run is active). A task
    it queues is named by its command id (--command-id, or the one printed): `dequeue`
    removes it."""
    if policy not in ("reject", "enqueue", "interrupt"):
        typer.echo(f"error: unknown policy {policy!r}", err=True)
        raise typer.Exit(code=2)
    payload: dict[str, Any] = {"text": text, "policy": policy}
    if timeout_ms:
        payload["timeoutMs"] = timeout_ms
    if retry_of:
        payload["retryOf"] = retry_of
    if input_json is not None:
        try:
            payload["input"] = json.loads(input_json)
        except ValueError as e:
            typer.echo(f"error: --input is not JSON: {e}", err=True)
            raise typer.Exit(code=2) from e
    if labels:
        payload["metadata"] = _labels(labels)
    _submit(session, "prompt", payload, tenant, wait, as_json, command_id, actor)


def _labels(given: list[str]) -> dict[str, str]:
    """`--label KEY=VALUE` options as a run's labels; exit 2 naming what is wrong."""
    from sessionstream.schemas.labels import label_problem

    out: dict[str, str] = {}
    for raw in given:
        key, sep, value = raw.partition("=")
        if not sep:
            typer.echo(f"error: --label {raw!r}: write KEY=VALUE", err=True)
            raise typer.Exit(code=2)
        if key in out:
            typer.echo(f"error: --label {key!r} given twice", err=True)
            raise typer.Exit(code=2)
        out[key] = value
    problem = label_problem(out)
    if problem is not None:
        typer.echo(f"error: --label: {problem}", err=True)
        raise typer.Exit(code=2)
    return out


def dequeue(
    session: Session,
    task: Annotated[
        str,
        typer.Argument(
            metavar="COMMAND_ID",
            help="the waiting task: the id of the command that queued it "
            "(run.queued's sourceCommandId; GET /v1/sessions/{id} lists the queue)",
            show_default=False,
        ),
    ],
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Remove a waiting task from SESSION's queue: run.dequeued, or rejected not_queued (the
    task has started, was removed before, or never waited)."""
    payload = {"commandId": task}
    _submit(session, "dequeue", payload, tenant, wait, as_json, command_id, actor)


def clear_queue(
    session: Session,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Remove every waiting task from SESSION's queue (one run.dequeued each), or rejected
    queue_empty. The active run goes on."""
    _submit(session, "clear_queue", {}, tenant, wait, as_json, command_id, actor)


def steer(
    session: Session,
    text: str,
    tenant: Tenant = "default",
    run: Run = None,
    any_run: AnyRun = False,
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Change the active run's course; delivered to its worker at the next step. Names the
    run it means (see --run / --any): a steer never lands on a run started after it."""
    target = _target(session, run, any_run, latest=True)
    _submit(session, "steer", {"text": text}, tenant, wait, as_json, command_id, actor, target)


def follow_up(
    session: Session,
    text: str,
    tenant: Tenant = "default",
    run: Run = None,
    any_run: AnyRun = False,
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Add information: pending for the active run until it takes it, or starts a run when
    the session is idle."""
    target = _target(session, run, any_run, latest=False)
    payload = {"text": text}
    _submit(session, "follow_up", payload, tenant, wait, as_json, command_id, actor, target)


def send(
    session: Session,
    text: str,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """The single send button: the runtime picks prompt, follow-up or queue from the state."""
    _submit(session, "send", {"text": text}, tenant, wait, as_json, command_id, actor)


def abort(
    session: Session,
    tenant: Tenant = "default",
    reason: Annotated[str, typer.Option(help="recorded with the cancel")] = "user",
    run: Run = None,
    any_run: AnyRun = False,
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Cancel the run: model request, tools, sub-tasks and pending actions. Names the run it
    means (default: the active one as last seen; --any: whichever is active then), so a late
    abort is refused `run_not_active` instead of cancelling a newer run."""
    target = _target(session, run, any_run, latest=True)
    payload = {"reason": reason}
    _submit(session, "abort", payload, tenant, wait, as_json, command_id, actor, target)


def tail(
    session: Session,
    from_start: Annotated[bool, typer.Option(help="print the session's history first")] = False,
    as_json: AsJson = False,
) -> None:
    """Print SESSION's events as they are committed (Ctrl-C to stop)."""
    from sessionstream.adapters.kafka import (
        OFFSET_BEGINNING,
        OFFSET_END,
        TopicPartition,
        new_reader,
    )
    from sessionstream.client import SessionClient
    from sessionstream.core.partitioning import partition_for

    s = get_settings()
    try:
        n = SessionClient("tail", s)._partition_count()
    except SessionstreamError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from e
    p = partition_for(session.encode(), n)
    consumer = new_reader(s, group_id=f"sessionstream-tail-{uuid.uuid4()}", fetch_wait_ms=50)
    consumer.assign(
        [TopicPartition(s.events_topic, p, OFFSET_BEGINNING if from_start else OFFSET_END)]
    )
    codec = reader_codec(s)
    try:
        while True:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None or msg.value() is None:
                continue
            event = codec.decode_event(msg.value() or b"")
            if event.session_id == session:
                _print_event(event, as_json)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def _print_event(e: Event, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(Codec.event_to_json(e)))
        return
    data = {k: v for k, v in Codec.event_to_json(e)["payload"].items() if v not in (None, [], "")}
    console.print(
        f"{e.ts} [bold]{e.type}[/bold] run {e.run_id[:8]} #{e.seq} gen {e.generation} "
        f"{json.dumps(data)[:120]}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    for fn in (prompt, steer, send, abort, dequeue, tail):
        app.command()(fn)
    app.command("follow-up")(follow_up)
    app.command("clear-queue")(clear_queue)
