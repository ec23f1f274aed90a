"""The ``sessionstream`` command line: a thin layer over the modules that do the work."""

from __future__ import annotations

import typer

__all__ = ["app", "main"]

app = typer.Typer(
    name="sessionstream",
    help="The single-writer protocol for AI-agent sessions, on Kafka.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print sessionstream's version."""
    from sessionstream import __version__

    typer.echo(__version__)


@app.command()
def smoke() -> None:
    """Round trip one record: new topic -> produce -> consume -> PostgreSQL -> read back."""
    from sessionstream._smoke import SmokeError, run_smoke
    from sessionstream.settings import get_settings

    try:
        run_smoke(get_settings(), echo=typer.echo)
    except SmokeError as e:
        typer.echo(f"smoke: FAILED: {e}", err=True)
        raise typer.Exit(code=1) from e


def main() -> None:
    """Console-script entry point."""
    app()
