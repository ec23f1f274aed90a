"""The ``sessionstream`` command line: a thin layer over the modules that do the work."""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer

__all__ = ["app", "main"]

app = typer.Typer(
    name="sessionstream",
    help="The single-writer protocol for AI-agent sessions, on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    # errors are one line (main), never a traceback
    pretty_exceptions_enable=False,
)


@app.command()
def version() -> None:
    """Print sessionstream's version."""
    from sessionstream import __version__

    typer.echo(__version__)


@app.command("settings")
def show_settings(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="every setting as a markdown table (the README's)")
    ] = False,
    process: Annotated[
        str | None,
        typer.Option(
            help="only the components this process builds: processor, sink, worker, gateway, "
            "analytics or webhooks (it ignores the others' variables)"
        ),
    ] = None,
) -> None:
    """Print the settings a command would run with (passwords masked), as JSON: every
    component, or those of one long-running process (--process)."""
    import json

    from sessionstream.settings import (
        COMPONENTS,
        PROCESS_COMPONENTS,
        get_settings,
        settings_for,
        settings_table,
    )

    if markdown:
        typer.echo(settings_table())
        return
    from urllib.parse import urlsplit

    if process is None:
        shown = get_settings().model_dump(mode="json")
    elif process not in PROCESS_COMPONENTS:
        _fail(f"unknown process {process!r}: one of {', '.join(PROCESS_COMPONENTS)}")
    else:
        fields = {"credentials_file"}
        for name in PROCESS_COMPONENTS[process]:
            fields |= set(COMPONENTS[name].model_fields)
        shown = settings_for(process).model_dump(mode="json", include=fields)
    for name, value in shown.items():
        if name.endswith("_url") and isinstance(value, str) and urlsplit(value).password:
            parts = urlsplit(value)
            netloc = parts.netloc.replace(f":{parts.password}@", ":**********@")
            shown[name] = parts._replace(netloc=netloc).geturl()
    typer.echo(json.dumps(shown, indent=2))


@app.command()
def smoke() -> None:
    """Round trip one record: new topic -> produce -> consume -> PostgreSQL -> read back."""
    from sessionstream.apps._smoke import SmokeError, run_smoke
    from sessionstream.settings import get_settings

    try:
        run_smoke(get_settings(), echo=typer.echo)
    except SmokeError as e:
        typer.echo(f"smoke: FAILED: {e}", err=True)
        raise typer.Exit(code=1) from e


topics_app = typer.Typer(help="Create or check the protocol's topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")


JsonLogs = Annotated[bool, typer.Option("--json-logs", help="one JSON object per log line")]
LogLevel = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        help="serve Prometheus /metrics on this port (default SESSIONSTREAM_METRICS_PORT)"
    ),
]


def _serve_metrics(port: int | None, process: str) -> None:
    from sessionstream.adapters import metrics
    from sessionstream.settings import settings_for

    port = port or settings_for(process).metrics_port
    try:
        metrics.serve(port)
    except OSError as e:
        _fail(f"cannot serve metrics on port {port}: {e}")


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


@topics_app.command("create")
def topics_create(
    align: Annotated[
        bool,
        typer.Option(
            help="also set the protocol's required settings (cleanup policy, timestamp type, "
            "record size) on topics that exist with others, and the ones set at creation "
            "(the compaction lag that bounds erasure)"
        ),
    ] = False,
) -> None:
    """Create the missing topics with their settings, register this version's schemas
    under their subjects (compatibility BACKWARD_TRANSITIVE), then check it all."""
    from sessionstream.adapters.registry import COMPATIBILITY, SchemaRegistry
    from sessionstream.adapters.topics import align_topics, check_topics, ensure_topics
    from sessionstream.errors import SessionstreamError
    from sessionstream.settings import get_settings

    try:
        created = ensure_topics(get_settings())
        if align:
            for name, changes in align_topics(get_settings()).items():
                typer.echo(f"aligned {name}: {changes}")
        check_topics(get_settings())
        ids: dict[str, int] = {}
        problems: list[str] = []
        if get_settings().schema_registry_url:
            registry = SchemaRegistry(get_settings())
            ids = registry.resolve()
            problems = registry.check()
    except SessionstreamError as e:
        _fail(str(e))
    if problems:
        _fail("\n".join(problems))
    typer.echo(f"created: {', '.join(created) or 'nothing (all exist)'}; checks passed")
    if ids:
        typer.echo(
            f"schemas registered ({COMPATIBILITY}): "
            + ", ".join(f"{kind} id {schema_id}" for kind, schema_id in ids.items())
        )
    else:
        typer.echo("schemas: no registry (SESSIONSTREAM_SCHEMA_REGISTRY_URL is empty)")


@topics_app.command("check")
def topics_check() -> None:
    """Verify co-partitioning (the input, events and changelog topics have one partition
    count), cleanup policies, timestamps and record sizes, and that this version's schemas
    are registered and compatible with each subject's history; non-zero exit on a problem."""
    from sessionstream.adapters.registry import SchemaRegistry
    from sessionstream.adapters.topics import check_topics, topic_specs
    from sessionstream.errors import SessionstreamError
    from sessionstream.settings import get_settings

    settings = get_settings()
    try:
        report = check_topics(settings)
        problems = SchemaRegistry(settings).check() if settings.schema_registry_url else []
    except SessionstreamError as e:
        _fail(str(e))
    if problems:
        _fail("\n".join(problems))
    for name, count in report.partitions.items():
        policy = report.configs.get(name, {}).get("cleanup.policy", "?")
        typer.echo(f"{name}: {count} partitions, cleanup.policy={policy}")
    together = [s.name for s in topic_specs(settings) if s.co_partitioned]
    n = report.partitions[settings.commands_topic]
    typer.echo(
        f"co-partitioned ({n} partitions each, murmur2 on the session id): " + ", ".join(together)
    )
    typer.echo(
        f"schemas: this version's registered and compatible ({settings.schema_registry_url})"
    )


@app.command()
def processor(
    instance: Annotated[
        str | None,
        typer.Option(help="stable instance id (default SESSIONSTREAM_PROCESSOR_INSTANCE or host)"),
    ] = None,
    json_logs: JsonLogs = False,
    log_level: LogLevel = "INFO",
    metrics_port: MetricsPort = None,
) -> None:
    """Run the session processor: commands -> decider -> events, exactly once."""
    from sessionstream.adapters._logging import setup_logging
    from sessionstream.apps._run import run_processor

    setup_logging(log_level, json_logs)
    _serve_metrics(metrics_port, "processor")
    code = run_processor(instance)
    raise typer.Exit(code=code)


@app.command()
def sink(
    batch_size: Annotated[int, typer.Option(help="most events per PostgreSQL transaction")] = 1000,
    linger_ms: Annotated[int, typer.Option(help="how long to wait to fill a batch")] = 20,
    mode: Annotated[str, typer.Option(help="copy (COPY into staging) or executemany")] = "copy",
    json_logs: JsonLogs = False,
    log_level: LogLevel = "INFO",
    metrics_port: MetricsPort = None,
) -> None:
    """Persist session.events into PostgreSQL, exactly once (offsets stored with the rows)."""
    from sessionstream.adapters._logging import setup_logging
    from sessionstream.apps._run import run_sink

    setup_logging(log_level, json_logs)
    _serve_metrics(metrics_port, "sink")
    if mode not in ("copy", "executemany"):
        _fail(f"unknown mode {mode!r} (copy or executemany)")
    raise typer.Exit(code=run_sink(batch_size, linger_ms, mode))


db_app = typer.Typer(help="PostgreSQL schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply the versioned migrations that are missing (idempotent)."""
    from rich.progress import Progress

    from sessionstream.adapters.postgres.migrate import migrate, migrations
    from sessionstream.errors import DatabaseUnavailable
    from sessionstream.settings import get_settings

    try:
        with Progress(transient=True) as bar:
            task = bar.add_task("migrating", total=len(migrations()))

            def applied(m: Any) -> None:
                bar.console.print(f"applied {m.version:04d}_{m.name}")
                bar.advance(task)

            done = migrate(
                get_settings().database_conninfo,
                schema=get_settings().database_schema,
                progress=applied,
            )
    except DatabaseUnavailable as e:
        _fail(f"cannot reach PostgreSQL: {e}")
    typer.echo("database up to date" if not done else f"{len(done)} migration(s) applied")


@app.command()
def worker(
    agent: Annotated[
        str,
        typer.Option(
            help="'reference', or 'package.module:function' naming an"
            " async def run(ctx: sessionstream.agent.RunContext)"
        ),
    ] = "reference",
    worker_id: Annotated[
        str | None, typer.Option(help="this worker's id (default: host-pid)")
    ] = None,
    lease_ms: Annotated[
        int | None, typer.Option(help="lease length (default SESSIONSTREAM_WORKER_LEASE_MS)")
    ] = None,
    capacity: Annotated[
        int, typer.Option(help="most runs executed at once (beyond: it takes no more)")
    ] = 100,
    json_logs: JsonLogs = False,
    log_level: LogLevel = "INFO",
    metrics_port: MetricsPort = None,
) -> None:
    """Run a run worker: find runs that need a holder, acquire their leases, execute them,
    propagate cancels (docs/workers.md)."""
    from sessionstream.adapters._logging import setup_logging
    from sessionstream.runtimes.worker._main import run_worker
    from sessionstream.settings import settings_for

    setup_logging(log_level, json_logs)
    _serve_metrics(metrics_port, "worker")
    settings = settings_for("worker")
    raise typer.Exit(code=run_worker(settings, agent, worker_id, lease_ms, capacity))


@app.command("model-server")
def model_server(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1 (0: a free one, logged)")] = 0,
    token_ms: Annotated[
        float, typer.Option(help="pause before each streamed word (a prompt's model_ms wins)")
    ] = 25.0,
    log_level: LogLevel = "INFO",
) -> None:
    """Serve a local OpenAI-compatible streaming chat API (for the demo and tests)."""
    import asyncio

    from sessionstream.adapters._logging import setup_logging
    from sessionstream.apps._model_server import serve

    setup_logging(log_level)
    asyncio.run(serve("127.0.0.1", port, token_ms, None))


from sessionstream.apps._cli_data import register as _register_data  # noqa: E402

_register_data(app)

from sessionstream.apps._cli_send import register as _register_send  # noqa: E402

_register_send(app)

from sessionstream.apps._cli_approvals import register as _register_approvals  # noqa: E402

_register_approvals(app)

from sessionstream.apps._cli_questions import register as _register_questions  # noqa: E402

_register_questions(app)

from sessionstream.apps._cli_gateway import register as _register_gateway  # noqa: E402

_register_gateway(app)

from sessionstream.apps._cli_schedules import register as _register_schedules  # noqa: E402

_register_schedules(app)

from sessionstream.apps._cli_webhooks import register as _register_webhooks  # noqa: E402

_register_webhooks(app)

from sessionstream.apps._cli_connect import register as _register_connect  # noqa: E402

_register_connect(app)

from sessionstream.apps._cli_flink import register as _register_flink  # noqa: E402

_register_flink(app)


@app.command()
def analytics(
    port: Annotated[
        int | None, typer.Option(help="JSON endpoints' port (default SESSIONSTREAM_ANALYTICS_PORT)")
    ] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Live run, duration, cancel-latency and rejection stats over session.events (faust),
    as JSON."""
    from sessionstream.runtimes.analytics.app import run_analytics
    from sessionstream.settings import settings_for

    settings = settings_for("analytics")
    if port:
        settings = settings.model_copy(update={"analytics_port": port})
    raise typer.Exit(code=run_analytics(settings, log_level))


@app.command()
def demo(
    keep: Annotated[
        bool,
        typer.Option(help="leave processor, sink, workers, analytics and the gateway running"),
    ] = False,
) -> None:
    """Start processor, sink, two workers, analytics and the gateway (its web console's URL
    is printed with a demo key) and play the protocol's scenes end to end."""
    from sessionstream.adapters._logging import setup_logging
    from sessionstream.apps.demo import run_demo
    from sessionstream.errors import SessionstreamError
    from sessionstream.settings import get_settings

    setup_logging("WARNING")
    try:
        code = run_demo(get_settings(), keep=keep)
    except (SessionstreamError, TimeoutError, RuntimeError) as e:
        _fail(str(e))
    raise typer.Exit(code=code)


def main() -> None:
    """Console-script entry point. An error sessionstream raises on purpose is one line on
    stderr and exit code 2, never a traceback; a driver error that escaped translation is
    reported the same way, naming its type. librdkafka's own complaints (a broker that is
    down: a line every few ms) stay quiet in short commands; the long-running ones log
    them at their --log-level."""
    import logging
    import os

    from sessionstream.errors import SessionstreamError
    from sessionstream.settings import unknown_variables

    logging.getLogger("sessionstream.adapters.kafka").setLevel(logging.CRITICAL)
    for line in unknown_variables(os.environ):
        typer.echo(f"warning: {line}", err=True)
    try:
        app()
    except SessionstreamError as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as e:  # a driver error nobody translated: still no traceback
        typer.echo(f"error: {type(e).__name__}: {e}", err=True)
        raise SystemExit(2) from None


from sessionstream.apps._cli_admin import register as _register_admin  # noqa: E402

_register_admin(app)
