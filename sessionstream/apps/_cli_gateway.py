"""CLI commands of the HTTP front door: `gateway` and `keys create|list|revoke`."""

from __future__ import annotations

import json
from typing import Annotated, NoReturn

import psycopg
import typer

from sessionstream.errors import SessionstreamError
from sessionstream.settings import get_settings, settings_for

__all__ = ["register"]

keys_app = typer.Typer(
    help="API keys of the gateway: each bound to a tenant and an actor.", no_args_is_help=True
)


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def gateway(
    host: Annotated[
        str | None, typer.Option(help="address to listen on (default SESSIONSTREAM_GATEWAY_HOST)")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="port (default SESSIONSTREAM_GATEWAY_PORT, 8080)")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
    access_log: Annotated[bool, typer.Option(help="log every request")] = False,
) -> None:
    """Serve the HTTP API (/v1, OpenAPI at /openapi.json) and the web console (/)."""
    from sessionstream.adapters._logging import setup_logging
    from sessionstream.apps.gateway.server import run_gateway

    setup_logging(log_level)
    settings = settings_for("gateway")
    update: dict[str, object] = {}
    if host:
        update["gateway_host"] = host
    if port:
        update["gateway_port"] = port
    raise typer.Exit(code=run_gateway(settings.model_copy(update=update), log_level, access_log))


def _connect() -> psycopg.Connection[tuple[object, ...]]:
    from sessionstream.adapters.postgres import connect

    try:
        return connect(get_settings())
    except SessionstreamError as e:
        _fail(str(e), 2)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="the tenant every command with this key is for")],
    actor: Annotated[
        str | None, typer.Option(help="who the key's commands are recorded as (default key:ID)")
    ] = None,
    name: Annotated[str | None, typer.Option(help="a note: what the key is for")] = None,
    admin: Annotated[
        bool, typer.Option("--admin", help="an admin key: may also erase the tenant's sessions")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Create a key and print it once: only its hash is stored."""
    from sessionstream.apps.gateway.keys import create_key

    with _connect() as conn:
        try:
            key, rec = create_key(conn, tenant, actor, name, "admin" if admin else "producer")
        except ValueError as e:
            _fail(str(e))
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "key": key,
                    "keyId": rec.key_id,
                    "tenantId": rec.tenant_id,
                    "actor": rec.actor,
                    "role": rec.role,
                }
            )
        )
        return
    typer.echo(key)
    typer.echo(
        f"key {rec.key_id}: tenant {rec.tenant_id}, actor {rec.actor}, role {rec.role} "
        "(shown once; only its hash is stored)",
        err=True,
    )


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's keys")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List keys (ids, tenants, actors, created, revoked); never their secrets."""
    from sessionstream.apps.gateway.keys import list_keys

    with _connect() as conn:
        keys = list_keys(conn, tenant)
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "keyId": k.key_id,
                        "tenantId": k.tenant_id,
                        "actor": k.actor,
                        "name": k.name,
                        "createdAt": k.created_at.isoformat(),
                        "revokedAt": k.revoked_at.isoformat() if k.revoked_at else None,
                    }
                    for k in keys
                ]
            )
        )
        return
    for k in keys:
        state = f"revoked {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "live"
        typer.echo(
            f"{k.key_id}  {k.tenant_id}  {k.actor}  {k.created_at:%Y-%m-%d %H:%M}  {state}"
            + (f"  {k.name}" if k.name else "")
        )


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="the key's id (ssk_<id>_...)")]) -> None:
    """Revoke a key (the gateway stops accepting it within SESSIONSTREAM_GATEWAY_KEY_CACHE_S)."""
    from sessionstream.apps.gateway.keys import parse_key, revoke_key

    key_id = parse_key(key_id) or key_id  # a whole key names its id too
    with _connect() as conn:
        if not revoke_key(conn, key_id):
            _fail(f"no live key {key_id}")
    typer.echo(f"revoked {key_id}")


def register(app: typer.Typer) -> None:
    app.command()(gateway)
    app.add_typer(keys_app, name="keys")
