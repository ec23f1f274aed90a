"""CLI commands that read what was recorded: replay, audit, stats."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sessionstream.errors import SessionstreamError
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import Event
from sessionstream.settings import get_settings

__all__ = ["register"]

replay_app = typer.Typer(
    help="Replay runs, sessions or offsets; rebuild the projection.", no_args_is_help=True
)
console = Console()


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


@contextmanager
def _db() -> Iterator[Any]:
    from sessionstream.adapters.postgres import connect

    try:
        conn = connect(get_settings())
    except SessionstreamError as e:
        _fail(str(e))
    with conn:
        yield conn


def _summary(e: Event) -> str:
    data = Codec.event_to_json(e)["payload"]
    text = ", ".join(f"{k}={v}" for k, v in data.items() if v not in (None, [], ""))
    return text if len(text) < 90 else text[:87] + "..."


def _print(events: list[Event], as_json: bool, title: str) -> None:
    if as_json:
        for e in events:
            typer.echo(json.dumps(Codec.event_to_json(e)))
        return
    table = Table(title=title)
    for col in ("run", "seq", "type", "gen", "ts", "payload"):
        table.add_column(col)
    for e in events:
        table.add_row(e.run_id[:8], str(e.seq), e.type, str(e.generation), str(e.ts), _summary(e))
    console.print(table)


JsonOpt = Annotated[bool, typer.Option("--json", help="JSON lines in the seed's event format")]
JsonDoc = Annotated[bool, typer.Option("--json", help="one JSON document instead of text")]


@replay_app.command("run")
def replay_run(run_id: str, as_json: JsonOpt = False) -> None:
    """Print a run's timeline from PostgreSQL, in seq order."""
    from sessionstream.runtimes.sink.replay import events_of_run

    with _db() as conn:
        events = events_of_run(conn, run_id)
    if not events:
        _fail(f"no events for run {run_id}")
    _print(events, as_json, f"run {run_id}")


@replay_app.command("session")
def replay_session(session_id: str, as_json: JsonOpt = False) -> None:
    """Print a session's timeline (its runs and its own log) from PostgreSQL, in log order."""
    from sessionstream.runtimes.sink.replay import events_of_session

    with _db() as conn:
        events = events_of_session(conn, session_id)
    if not events:
        _fail(f"no events for session {session_id}")
    _print(events, as_json, f"session {session_id}")


@replay_app.command("offsets")
def replay_offsets(
    partition: Annotated[
        int | None,
        typer.Option(help="events partition (default with --session: the session's own)"),
    ] = None,
    from_: Annotated[int, typer.Option("--from", help="first offset")] = 0,
    to: Annotated[int | None, typer.Option(help="stop before this offset")] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="start at the first event appended at or after this time (ISO 8601, e.g. "
            "2026-12-05T10:00:00Z; no zone: UTC; or epoch ms); instead of --from"
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="stop before the first event appended at or after this time"),
    ] = None,
    session: Annotated[
        str | None, typer.Option(help="only this session's events (decodes only those)")
    ] = None,
    run: Annotated[str | None, typer.Option(help="only this run's events")] = None,
    fold: Annotated[
        bool, typer.Option(help="fold the events and print each session's state")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Read the events topic directly (read_committed) and print or re-fold it: an offset
    range, or a time range (--since / --until, by the broker's append time)."""
    from sessionstream.core.decider import evolve
    from sessionstream.core.state import SessionState
    from sessionstream.runtimes.sink.replay import (
        offsets_for_time,
        parse_time,
        read_range,
        session_partition,
    )

    settings = get_settings()
    if partition is None:
        if session is None:
            _fail("give --partition, or --session (its partition is then found)")
        partition = session_partition(settings, session)
    try:
        if since is not None:
            from_ = offsets_for_time(settings, parse_time(since), [partition])[partition]
        if until is not None:
            to = offsets_for_time(settings, parse_time(until), [partition])[partition]
            if to <= from_:
                _print([], as_json, f"partition {partition} from {from_}")
                return
        events = [
            e
            for _o, e in read_range(settings, partition, from_, to, session_id=session, run_id=run)
        ]
    except ValueError as bad:  # a partition the topic does not have
        _fail(str(bad))
    if not fold:
        _print(events, as_json, f"partition {partition} from {from_}")
        return
    states: dict[str, SessionState] = {}
    for e in events:
        states[e.session_id] = evolve(
            states.get(e.session_id) or SessionState.initial(e.session_id), e
        )
    for sid, st in states.items():
        active = (
            f"{st.active.run_id} {st.active.status} gen {st.active.generation}"
            if st.active
            else "idle"
        )
        typer.echo(
            json.dumps({"sessionId": sid, "active": active, "queued": len(st.queue)})
            if as_json
            else f"{sid}: {active}, {len(st.queue)} queued"
        )


@replay_app.command("rebuild")
def replay_rebuild(
    keep: Annotated[bool, typer.Option(help="keep the rebuilt schema for inspection")] = False,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="processes loading partitions in parallel (default: one per CPU)"),
    ] = None,
) -> None:
    """Re-project PostgreSQL from the events topic into a fresh schema; compare with live."""
    from sessionstream.runtimes.sink.replay import rebuild

    # refreshed by the rebuild's own progress calls: no refresh thread, so the loader
    # processes can be forked (sessionstream.runtimes.sink.rebuild forks only a single-threaded
    # process)
    with Progress(console=console, transient=True, auto_refresh=False) as progress:
        task = progress.add_task("rebuilding", total=None)

        def step(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, refresh=True)

        report = rebuild(get_settings(), keep=keep, progress=step, workers=workers)
    for table, n in report.differences.items():
        typer.echo(f"{table}: {'equal' if n == 0 else f'{n} differing rows'}")
    by = (
        "in this process"
        if report.loaders == 1
        else f"by {report.loaders} {'forked' if report.started_by == 'fork' else 'spawned'}"
        " processes"
    )
    typer.echo(
        f"{report.events} events re-projected into {report.schema} (load {report.load_s:.1f} s"
        f" {by},"
        f" keys and indexes {report.index_s:.1f} s, comparison {report.compare_s:.1f} s)"
        f"{' (kept)' if keep else ' (dropped)'}"
    )
    if not report.equal:
        raise typer.Exit(code=1)


def audit(as_json: JsonDoc = False) -> None:
    """Run the pre-launch checklist against the live system; non-zero exit on any FAIL."""
    from sessionstream.runtimes.sink.audit import run_audit

    with _db() as conn:
        checks = run_audit(get_settings(), conn)
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {"check": c.number, "title": c.title, "ok": c.ok, "evidence": c.evidence}
                    for c in checks
                ]
            )
        )
    else:
        for c in checks:
            mark = "[green]PASS[/green]" if c.ok else "[red]FAIL[/red]"
            console.print(f"{mark} {c.number}. {c.title}")
            for line in c.evidence:
                console.print(f"       {line}", highlight=False)
    if not all(c.ok for c in checks):
        raise typer.Exit(code=1)


def stats(as_json: JsonDoc = False) -> None:
    """Runs by terminal status, durations, cancel latency, time-outs, rejections, per tenant."""
    from sessionstream.runtimes.sink.stats import run_stats

    with _db() as conn:
        data = run_stats(conn)
    if as_json:
        typer.echo(json.dumps(data))
        return
    for tenant, t in data["tenants"].items():
        console.print(f"[bold]tenant {tenant}[/bold]")
        console.print(f"  runs: {t['runs']}")
        console.print(f"  duration ms: {t['duration_ms']}")
        console.print(f"  cancel latency ms: {t['cancel_latency_ms']}")
        console.print(f"  timed out: {t['timed_out']}; rejections: {t['rejections']}")


def register(app: typer.Typer) -> None:
    app.add_typer(replay_app, name="replay")
    app.command()(audit)
    app.command()(stats)
