"""`sessionstream flink-sql`: the Flink SQL queries of sessionstream/runtimes/analytics/flink/ over
session.events, run with the Flink virtualenv's Python (`make flink` installs it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]

_REPO = Path(__file__).resolve().parents[2]
_INSTALL = _REPO / "stack" / "flink" / "install.sh"
_JOB = _REPO / "sessionstream" / "runtimes" / "analytics" / "flink_job.py"


def _flink_python() -> Path:
    """The Flink virtualenv's interpreter, as install.sh names it (it may be elsewhere)."""
    where = subprocess.run([str(_INSTALL), "where"], capture_output=True, text=True, check=True)
    env = dict(line.split("=", 1) for line in where.stdout.splitlines() if "=" in line)
    return Path(env["FLINK_PYTHON"])


def register(app: typer.Typer) -> None:
    """Add `flink-sql` to the CLI."""

    @app.command("flink-sql")
    def flink_sql(
        bounded: Annotated[
            bool, typer.Option(help="read to the end offsets at start, print, exit")
        ] = False,
        query: Annotated[
            list[str] | None, typer.Option(help="only this query (repeatable; default all)")
        ] = None,
    ) -> None:
        """Flink SQL over session.events (read_committed): runs by status per tenant per
        minute, durations and cancel-latency percentiles, rejections by reason, active runs;
        one JSON line per result row. Continuous unless --bounded."""
        from sessionstream.apps._procs import settings_env
        from sessionstream.settings import get_settings

        python = _flink_python()
        if not python.exists():
            typer.echo(f"error: {python} is missing; run 'make flink'", err=True)
            raise typer.Exit(code=1)
        from sessionstream.adapters.connect import framed_starts

        settings = get_settings()
        args = [str(python), str(_JOB)]
        if bounded:
            args.append("--bounded")
        # a log begun before the schema registry: its first records have no Confluent
        # framing, which the avro-confluent format cannot read; start past them, loudly
        starts = framed_starts(settings, every_partition=True)
        skipped = {p: (o, low) for p, (o, low) in starts.items() if o > low}
        for p, (o, low) in sorted(skipped.items()):
            typer.echo(
                f"{settings.events_topic}[{p}]: starts at offset {o}: offsets {low}..{o - 1} are"
                " in the single-object framing written before the schema registry, which"
                " Flink's avro-confluent format cannot read (they are in PostgreSQL's"
                " projection; docs/analytics.md)",
                err=True,
            )
        if skipped:
            args += [
                "--start-offsets",
                ",".join(f"{p}:{o}" for p, (o, _) in sorted(starts.items())),
            ]
        for q in query or []:
            args += ["--query", q]
        env = settings_env(settings)
        # the job's exit status is the command's (1: a record it could not decode)
        os.execve(args[0], args, env)
