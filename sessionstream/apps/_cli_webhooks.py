"""CLI commands of the webhooks: `webhooks create|list|delete|dead-letters|run|redeliver`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer

from sessionstream.errors import SessionstreamError
from sessionstream.settings import Settings, settings_for

__all__ = ["register"]

webhooks_app = typer.Typer(
    help="Webhooks: each tenant's subscriptions, the deliverer, redelivery (docs/webhooks.md).",
    no_args_is_help=True,
)

AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def _settings() -> Settings:
    try:
        return settings_for("webhooks")
    except SessionstreamError as e:
        _fail(str(e), 2)


@contextmanager
def _db(settings: Settings) -> Iterator[Any]:
    from sessionstream.adapters.postgres import connect

    try:
        conn = connect(settings)
    except SessionstreamError as e:
        _fail(str(e), 2)
    with conn:
        yield conn


@webhooks_app.command("create")
def create(
    tenant: Annotated[str, typer.Option(help="the tenant whose events it is sent")],
    url: Annotated[str, typer.Option(help="http(s) URL the events are POSTed to")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event",
            help="event type to send: run.finished, a prefix run.*, or * (repeat the option; "
            "default *)",
        ),
    ] = None,
    description: Annotated[str | None, typer.Option(help="a note: what it is for")] = None,
    as_json: AsJson = False,
) -> None:
    """Subscribe a URL to a tenant's events and print its signing secret once (it is kept
    sealed; nothing shows it again)."""
    from sessionstream.runtimes.webhooks.admission import admit_url, events_ends
    from sessionstream.runtimes.webhooks.deliverer import sealer_of
    from sessionstream.runtimes.webhooks.store import create_subscription

    settings = _settings()
    try:
        sealer = sealer_of(settings)
        asyncio.run(admit_url(settings, url))
        starts = events_ends(settings)
        with _db(settings) as conn:
            secret, sub = create_subscription(
                conn, sealer, tenant, url, event or ["*"], starts, description
            )
    except (SessionstreamError, ValueError) as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps({**sub.json(), "secret": secret}))
        return
    typer.echo(secret)
    typer.echo(
        f"webhook {sub.subscription_id}: tenant {sub.tenant_id}, {sub.url}, "
        f"{' '.join(sub.event_types)} (the secret is shown once)",
        err=True,
    )


@webhooks_app.command("list")
def list_(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's")] = None,
    as_json: AsJson = False,
) -> None:
    """List the live subscriptions (never their secrets)."""
    from sessionstream.runtimes.webhooks.store import list_subscriptions

    settings = _settings()
    with _db(settings) as conn:
        subs = list_subscriptions(conn, tenant)
    if as_json:
        typer.echo(json.dumps([s.json() for s in subs]))
        return
    for s in subs:
        typer.echo(
            f"{s.subscription_id}  {s.tenant_id}  {s.url}  {','.join(s.event_types)}  "
            f"{s.secret_prefix}…  {s.created_at:%Y-%m-%d %H:%M}"
            + (f"  {s.description}" if s.description else "")
        )


@webhooks_app.command("delete")
def delete(
    subscription_id: Annotated[str, typer.Argument(help="the webhook's id (wh_...)")],
) -> None:
    """Delete a subscription: nothing more is sent to it (running deliverers drop what
    they hold for it within seconds); its dead letters stay."""
    from sessionstream.runtimes.webhooks.store import delete_subscription

    settings = _settings()
    with _db(settings) as conn:
        if not delete_subscription(conn, subscription_id):
            _fail(f"no live webhook {subscription_id}")
    typer.echo(f"deleted {subscription_id}")


@webhooks_app.command("dead-letters")
def dead_letters(
    subscription_id: Annotated[str, typer.Argument(help="the webhook's id (wh_...)")],
    limit: Annotated[int, typer.Option(help="at most this many")] = 100,
    as_json: AsJson = False,
) -> None:
    """List a subscription's dead letters in log order, with where each event is
    (partition:offset, what `redeliver --from-offset` takes) and its last error."""
    from sessionstream.runtimes.webhooks.store import list_dead_letters

    settings = _settings()
    with _db(settings) as conn:
        rows = list_dead_letters(conn, subscription_id, limit=limit)
    if as_json:
        typer.echo(json.dumps([r.json() for r in rows]))
        return
    for r in rows:
        typer.echo(
            f"{r.partition}:{r.offset}  {r.event_id}  {r.event_type}  "
            f"{r.attempts} attempt(s)  {r.last_error}"
        )


@webhooks_app.command("run")
def run(
    group: Annotated[
        str | None, typer.Option(help="consumer group (default SESSIONSTREAM_WEBHOOKS_GROUP)")
    ] = None,
    json_logs: Annotated[
        bool, typer.Option("--json-logs", help="one JSON object per log line")
    ] = False,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="serve Prometheus /metrics on this port (default SESSIONSTREAM_METRICS_PORT)"
        ),
    ] = None,
) -> None:
    """Deliver the events topic to the subscriptions, at least once, signed (Standard
    Webhooks); instances of one group share the partitions. Stops on SIGTERM after the
    attempts in flight."""
    import logging
    import signal

    from sessionstream.adapters import metrics
    from sessionstream.adapters._logging import setup_logging
    from sessionstream.runtimes.webhooks.deliverer import Deliverer

    setup_logging(log_level, json_logs)
    log = logging.getLogger("sessionstream.webhooks")
    settings = _settings()
    port = metrics_port or settings.metrics_port
    try:
        metrics.serve(port)
    except OSError as e:
        _fail(f"cannot serve metrics on port {port}: {e}")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        deliverer = Deliverer(settings, group=group)
        await deliverer.run(stop)
        log.info("webhooks stopped: %s", deliverer.stats)

    try:
        asyncio.run(main())
    except SessionstreamError as e:
        log.error("%s", e)
        raise typer.Exit(code=2) from None


def _offsets(values: list[str]) -> dict[int, int]:
    out = {}
    for v in values:
        p, sep, o = v.partition(":")
        if not sep or not p.isdigit() or not o.isdigit():
            _fail(f"--from-offset {v!r}: write PARTITION:OFFSET, e.g. 0:1200")
        out[int(p)] = int(o)
    return out


@webhooks_app.command("redeliver")
def redeliver(
    subscription: Annotated[str, typer.Option(help="the webhook's id (wh_...)")],
    from_offset: Annotated[
        list[str] | None,
        typer.Option(
            "--from-offset",
            help="PARTITION:OFFSET to start from (repeat for several partitions; see "
            "`webhooks dead-letters`)",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="start at the events appended at or after this time, in every "
            "partition (ISO 8601 or epoch ms)"
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "WARNING",
) -> None:
    """Send a subscription its events again from the log, up to where it ends now: in
    order per session, retried and dead-lettered as the deliverer does. A receiver dedupes
    by webhook-id."""
    from sessionstream.adapters._logging import setup_logging
    from sessionstream.runtimes.sink.replay import offsets_for_time, parse_time
    from sessionstream.runtimes.webhooks.redeliver import redeliver as run_redelivery

    setup_logging(log_level)
    if bool(from_offset) == (since is not None):
        _fail("give --from-offset PARTITION:OFFSET (one or more) or --since TIME")
    settings = _settings()
    try:
        if since is not None:
            try:
                at = parse_time(since)
            except ValueError as e:
                _fail(f"--since: {e}")
            starts = offsets_for_time(settings, at)
        else:
            starts = _offsets(from_offset or [])
        report = asyncio.run(run_redelivery(settings, subscription, starts))
    except SessionstreamError as e:
        _fail(str(e), 2)
    ranges = ", ".join(f"{p}:{a}-{b}" for p, (a, b) in sorted((report.ranges or {}).items()))
    typer.echo(
        f"{subscription}: events read: {report.read} ({ranges or 'nothing to read'}), "
        f"for this webhook: {report.matched}, delivered: {report.delivered}, "
        f"dead letters: {report.dead_letters} (earlier dead letters cleared: "
        f"{report.dead_letters_cleared})"
    )
    if report.dead_letters:
        raise typer.Exit(code=3)


def register(app: typer.Typer) -> None:
    app.add_typer(webhooks_app, name="webhooks")
