"""``sessionstream sessions erase``: an administrator's commands (docs/protocol.md, erasure).

They go to the control topic (the timers topic), which only the processor and
administrators may write: run it with an administrator's Kafka credentials. A producer's
credentials are refused by the broker's ACLs; the same command on the producers' topic is
rejected ``not_allowed_here``."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from sessionstream.apps._cli_send import _submit

__all__ = ["register"]

sessions_app = typer.Typer(help="Administer sessions (erasure).", no_args_is_help=True)


@sessions_app.command("erase")
def erase(
    session: Annotated[str, typer.Argument(help="the session's full id (tenant:own-id)")],
    tenant: Annotated[str, typer.Option(help="the session's tenant")] = "default",
    reason: Annotated[
        str | None, typer.Option(help="why (recorded on the erasure; no personal data)")
    ] = None,
    wait: Annotated[float, typer.Option(help="seconds to wait for the outcome; 0: don't")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the outcome as JSON")] = False,
    actor: Annotated[str | None, typer.Option(help="who erases (recorded)")] = None,
) -> None:
    """Erase a session everywhere: its events get tombstones, its rows go, its state keeps
    only counters. Refused (`session_busy`) while a run is active: abort it first."""
    payload = {} if reason is None else {"reason": reason}
    _submit(session, "session.erase", payload, tenant, wait, as_json, str(uuid.uuid4()), actor)
    # (`SessionClient.erase` is the same from Python)


def register(app: typer.Typer) -> None:
    app.add_typer(sessions_app, name="sessions")
