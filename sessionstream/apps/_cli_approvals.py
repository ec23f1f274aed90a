"""CLI commands of the action gate: `approvals list|approve|deny` (docs/protocol.md#approvals).

`list` reads PostgreSQL (the sink's projection, a moment behind the log); `approve` and
`deny` find the run's session there, check it is the tenant's, and send `action.approve` /
`action.deny` naming the run, as `--actor` (recorded as `decidedBy`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from sessionstream.apps._cli_send import Actor, AsJson, CommandId, Wait, _submit
from sessionstream.errors import DatabaseError, SessionstreamError
from sessionstream.settings import get_settings

__all__ = ["register"]

approvals_app = typer.Typer(
    help="Actions waiting for a person's approval: list them, approve or deny one.",
    no_args_is_help=True,
)

Tenant = Annotated[
    str, typer.Option(help="the tenant whose runs these are (a run of another is not found)")
]
RunArg = Annotated[str, typer.Argument(help="the run whose action it is", show_default=False)]
KeyArg = Annotated[str, typer.Argument(help="the action's idempotency key", show_default=False)]
Digest = Annotated[
    str | None,
    typer.Option(
        "--digest",
        help="the argsDigest the person was shown (as `approvals list` prints it; omit for an "
        "action asked without arguments)",
    ),
]
Generation = Annotated[
    int | None,
    typer.Option(help="the request's generation (default: whichever is pending)", min=1),
]


def _db_call(fn: Any, *args: Any) -> Any:
    from sessionstream.adapters.postgres import connect, translated

    settings = get_settings()
    try:
        with translated(settings.database_conninfo, queries=True), connect(settings) as conn:
            return fn(conn, *args)
    except (DatabaseError, SessionstreamError) as e:
        typer.echo(f"error: PostgreSQL: {e}", err=True)
        raise typer.Exit(code=2) from e


@approvals_app.command("list")
def list_(
    tenant: Tenant = "default",
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many")] = 200,
    as_json: AsJson = False,
) -> None:
    """The tenant's actions waiting for a person (active runs only), the window closing
    soonest first: run, session, key, kind, argsDigest, generation, expiresAt."""
    import time

    from sessionstream.runtimes.sink.approvals import pending_approvals

    rows: list[dict[str, Any]] = _db_call(pending_approvals, tenant, limit)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo(f"no action of tenant {tenant!r} waits for a person")
        return
    now = int(time.time() * 1000)
    for r in rows:
        left = max(0, (r["expiresAt"] or 0) - now) // 1000
        typer.echo(
            f"run {r['runId']} key {r['key']} kind {r['kind']} digest {r['argsDigest']} "
            f"gen {r['generation']} {left}s left (session {r['sessionId']})"
        )


def _session_of(run: str, tenant: str) -> str:
    def find(conn: Any) -> tuple[str, str] | None:
        row = conn.execute(
            "select session_id, tenant_id from agent_runs where run_id = %s", (run,)
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    found = _db_call(find)
    if found is None or found[1] != tenant:
        typer.echo(f"error: no run {run!r} of tenant {tenant!r} in PostgreSQL", err=True)
        raise typer.Exit(code=2)
    return str(found[0])


@approvals_app.command("approve")
def approve(
    run: RunArg,
    key: KeyArg,
    digest: Digest = None,
    generation: Generation = None,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Approve the pending action KEY of RUN (exit 1 when rejected: not pending, another
    digest, a stale generation, expired)."""
    payload = {"idempotencyKey": key, "argsDigest": digest, "generation": generation}
    session = _session_of(run, tenant)
    _submit(session, "action.approve", payload, tenant, wait, as_json, command_id, actor, run)


@approvals_app.command("deny")
def deny(
    run: RunArg,
    key: KeyArg,
    digest: Digest = None,
    reason: Annotated[str | None, typer.Option(help="why, in the person's words")] = None,
    generation: Generation = None,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Deny the pending action KEY of RUN; the worker's action raises ActionDenied."""
    payload = {
        "idempotencyKey": key,
        "argsDigest": digest,
        "generation": generation,
        "reason": reason,
    }
    session = _session_of(run, tenant)
    _submit(session, "action.deny", payload, tenant, wait, as_json, command_id, actor, run)


def register(app: typer.Typer) -> None:
    app.add_typer(approvals_app, name="approvals")
