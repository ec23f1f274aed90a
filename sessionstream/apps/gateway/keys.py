"""API keys bound to a tenant and an actor: created once, stored only as a hash.

A key looks like ``ssk_<key_id>_<secret>``: `key_id` (12 hex digits) is its visible name,
stored as is, and `secret` 32 random bytes (urlsafe base64). The table keeps the SHA-256 of
the whole key; a plain hash is enough for 256 random bits (no password to stretch), and
`hmac.compare_digest` compares it. Nothing can show a key again after `create_key`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import psycopg

from sessionstream.schemas.sessions import NAMESPACE_SEP

__all__ = [
    "KEY_PREFIX",
    "ROLES",
    "ApiKey",
    "create_key",
    "hash_key",
    "list_keys",
    "lookup_key",
    "parse_key",
    "revoke_key",
]

KEY_PREFIX: Final = "ssk_"
_SHAPE: Final = re.compile(r"^ssk_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
#: as the wire contract's ids (sessionstream.schemas.commands.MAX_ID_CHARS)
MAX_NAME_CHARS: Final = 200


@dataclass(frozen=True)
class ApiKey:
    """What a key grants: it acts as `actor` of `tenant_id`; revoked when `revoked_at`."""

    key_id: str
    tenant_id: str
    actor: str
    name: str | None
    created_at: datetime
    revoked_at: datetime | None = None
    #: `producer` (the producers' commands) or `admin` (also erases the tenant's sessions)
    role: str = "producer"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key(key: str) -> str | None:
    """The key's id, or None when `key` does not have a key's shape."""
    m = _SHAPE.match(key)
    return m.group(1) if m else None


def _check(what: str, value: str) -> None:
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise ValueError(f"{what} must be 1-{MAX_NAME_CHARS} characters")


_COLUMNS = "key_id, tenant_id, actor, name, created_at, revoked_at, role"

#: the roles a key may have
ROLES: Final = ("producer", "admin")


def _row(r: tuple[Any, ...]) -> ApiKey:
    return ApiKey(*r)


def create_key(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    actor: str | None = None,
    name: str | None = None,
    role: str = "producer",
) -> tuple[str, ApiKey]:
    """A new key for `tenant_id`: returns the key itself (to show once) and its record.
    `actor` defaults to ``key:<key_id>``; `role` is one of `ROLES`."""
    _check("tenant", tenant_id)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if NAMESPACE_SEP in tenant_id:
        raise ValueError(
            f"tenant must not contain {NAMESPACE_SEP!r}: it names the tenant's namespace "
            "of session ids (sessionstream.schemas.sessions)"
        )
    if actor is not None:
        _check("actor", actor)
    while True:
        key_id = secrets.token_hex(6)
        key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        row = conn.execute(
            f"insert into api_keys (key_id, key_hash, tenant_id, actor, name, role)"
            f" values (%s, %s, %s, %s, %s, %s) on conflict (key_id) do nothing"
            f" returning {_COLUMNS}",
            (key_id, hash_key(key), tenant_id, actor or f"key:{key_id}", name, role),
        ).fetchone()
        conn.commit()
        if row is not None:  # else: 48-bit id collision, draw again
            return key, _row(row)


def list_keys(conn: psycopg.Connection[Any], tenant_id: str | None = None) -> list[ApiKey]:
    """Every key (of one tenant), oldest first; never their secrets."""
    sql = f"select {_COLUMNS} from api_keys"
    rows = (
        conn.execute(f"{sql} where tenant_id = %s order by created_at", (tenant_id,))
        if tenant_id
        else conn.execute(f"{sql} order by created_at")
    ).fetchall()
    conn.rollback()
    return [_row(r) for r in rows]


def revoke_key(conn: psycopg.Connection[Any], key_id: str) -> bool:
    """Revoke a key by id; False if there is no such key or it was revoked already."""
    row = conn.execute(
        "update api_keys set revoked_at = now() where key_id = %s and revoked_at is null"
        " returning key_id",
        (key_id,),
    ).fetchone()
    conn.commit()
    return row is not None


def lookup_key(conn: psycopg.Connection[Any], key: str) -> ApiKey | None:
    """The live (not revoked) key `key` is, or None."""
    key_id = parse_key(key)
    if key_id is None:
        return None
    row = conn.execute(
        f"select key_hash, {_COLUMNS} from api_keys where key_id = %s", (key_id,)
    ).fetchone()
    conn.rollback()
    if row is None or not hmac.compare_digest(str(row[0]), hash_key(key)):
        return None
    found = _row(row[1:])
    return None if found.revoked_at is not None else found
