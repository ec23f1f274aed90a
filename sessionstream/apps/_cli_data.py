"""CLI commands that read what was recorded: replay, runs list, audit, stats."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sessionstream.errors import SessionstreamError
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings, get_settings

if TYPE_CHECKING:
    from sessionstream.runtimes.sink.cursor import CursorCodec

__all__ = ["register"]

replay_app = typer.Typer(
    help="Replay runs, sessions or offsets; rebuild the projection.", no_args_is_help=True
)
runs_app = typer.Typer(help="Search the recorded runs (PostgreSQL).", no_args_is_help=True)
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


def _cursor_codec(settings: Settings) -> CursorCodec:
    """`gateway_cursor_secret`'s codec (cursors then pass between the CLI and the gateways
    when tenant and filters match); unset, one derived from the database credentials: the
    same on every call, and whoever holds them reads every row without a cursor anyway."""
    from sessionstream.runtimes.sink.cursor import CursorCodec, derive_key

    secret = settings.gateway_cursor_secret
    if secret is not None:
        return CursorCodec(derive_key(secret.get_secret_value()))
    return CursorCodec(derive_key(settings.database_conninfo, "cli-search-cursor"))


@runs_app.command("list")
def runs_list(
    status: Annotated[
        str | None,
        typer.Option(
            help="running, compacting, cancelling, completed, cancelled, failed or timed_out;"
            " several comma-separated (any of them matches)"
        ),
    ] = None,
    actor: Annotated[str | None, typer.Option(help="who started the run")] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="key:value; repeat it (every label must match)")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="created at or after this time (RFC 3339, e.g. 2026-12-05T10:00:00Z; no zone:"
            " UTC; or epoch ms)"
        ),
    ] = None,
    until: Annotated[str | None, typer.Option(help="created before this time")] = None,
    session: Annotated[
        str | None,
        typer.Option(help="only this session's runs: its full id, as `replay session` takes it"),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option(help="only this tenant's runs (default: every tenant's)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="runs per page")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="the next cursor a previous call printed (same filters)")
    ] = None,
    as_json: JsonDoc = False,
) -> None:
    """Runs newest first, filtered, a page at a time: the search of GET /v1/runs, read
    from PostgreSQL (every tenant's unless --tenant)."""
    from sessionstream.apps.gateway.views import run_json
    from sessionstream.runtimes.sink.cursor import CursorError
    from sessionstream.runtimes.sink.search import Filters, Search, SearchInvalid, find

    settings = get_settings()
    if tenant is not None and not 1 <= len(tenant) <= 200:
        _fail("--tenant must be 1-200 characters")
    try:
        filters = Filters.of(
            status=status,
            actor=actor,
            labels=label or [],
            since=since,
            until=until,
            session_id=session,
        )
    except SearchInvalid as e:
        _fail(f"--{e}")
    search = Search("runs", tenant, filters)
    codec = _cursor_codec(settings)
    try:
        after = None if cursor is None else codec.decode(cursor, search.digest())
    except CursorError as e:
        _fail(f"--cursor: {e} ({e.code}); start again without --cursor")
    with _db() as conn:
        page = find(conn, search, after, limit)
    runs = [run_json(r, local_ids=False) for r in page.rows]
    nxt = None if page.next is None else codec.encode(page.next, search.digest())
    if as_json:
        typer.echo(json.dumps({"runs": runs, "nextCursor": nxt}))
        return
    # an aligned plain table: whole ids (what `replay run` takes) at any terminal width,
    # one run per line for grep; only the prompt is cut
    head = ["created (UTC)", "run", "session", "status", "started by", "labels", "prompt"]
    lines = [head]
    for r in runs:
        created = datetime.fromtimestamp(r["createdAt"] / 1000, UTC)
        prompt = " ".join(r["prompt"].split())
        lines.append(
            [
                created.strftime("%Y-%m-%d %H:%M:%S"),
                r["runId"],
                r["sessionId"],
                r["status"],
                r["startedBy"] or "-",
                ",".join(f"{k}:{v}" for k, v in (r["labels"] or {}).items()) or "-",
                prompt if len(prompt) <= 40 else prompt[:39] + "…",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines if runs else []:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    typer.echo(f"next: --cursor {nxt}" if nxt else f"({len(runs)} runs, the last page)")


def audit(as_json: JsonDoc = False) -> None:
    """Run the pre-launch checklist against the live system; non-zero exit on any FAIL."""
    from sessionstream.runtimes.sink.audit import run_audit

    with _db() as conn:
        settings = get_settings()
        checks = run_audit(settings, conn, policy=settings.approval_kinds)
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
    app.add_typer(runs_app, name="runs")
    app.command()(audit)
    app.command()(stats)
