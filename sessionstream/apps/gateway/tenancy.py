"""Which session a tenant means: the full id of a URL's ``{sessionId}``.

Tenant T's session S is ``T:S`` (`sessionstream.schemas.sessions`), so two tenants never meet in one
session and no answer depends on whether another tenant has a session of that name.
Sessions that existed before ids were namespaced keep their ids; migration 0006 wrote an
alias for each (T, S) -> S, and only it writes aliases. The gateway asks for an alias
once per (tenant, id) and keeps the answer (an LRU of `max_entries`); a database
without aliases (every install after 0006) is never asked at all.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import psycopg

from sessionstream.apps.gateway._flight import SingleFlight
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.errors import DatabaseUnavailable
from sessionstream.schemas.sessions import NAMESPACE_SEP, scoped_session_id

__all__ = ["Sessions", "alias_of", "has_aliases"]


def has_aliases(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("select exists (select 1 from session_aliases)").fetchone()
    conn.rollback()
    return bool(row and row[0])


def alias_of(conn: psycopg.Connection[Any], tenant_id: str, local_id: str) -> str | None:
    row = conn.execute(
        "select session_id from session_aliases where tenant_id = %s and local_id = %s",
        (tenant_id, local_id),
    ).fetchone()
    conn.rollback()
    return None if row is None else str(row[0])


class Sessions:
    """Full session ids of the tenants' own ids."""

    def __init__(self, db: Database, *, max_entries: int = 100_000) -> None:
        self.db = db
        self.max_entries = max_entries
        #: None until known; True when the database may hold aliases
        self.aliases: bool | None = None
        self._known: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._asking: SingleFlight[tuple[str, str], str] = SingleFlight()

    async def start(self) -> None:
        try:
            self.aliases = await self.db.run(has_aliases)
        except DatabaseUnavailable:
            self.aliases = None  # asked again on the first request

    async def full_id(self, tenant_id: str, local_id: str) -> str:
        """The full id of `tenant_id`'s session `local_id`."""
        if NAMESPACE_SEP in tenant_id:
            raise ApiError(
                403,
                "tenant_not_namespaced",
                f"tenant {tenant_id!r} contains {NAMESPACE_SEP!r}: its sessions cannot be "
                "told from another tenant's (give the key a tenant id without it)",
            )
        if self.aliases is None:
            self.aliases = await self.db.run(has_aliases)
        if not self.aliases:
            return scoped_session_id(tenant_id, local_id)
        key = (tenant_id, local_id)
        hit = self._known.get(key)
        if hit is not None:
            self._known.move_to_end(key)
            return hit
        return await self._asking.do(key, lambda: self._fetch(tenant_id, local_id))

    async def _fetch(self, tenant_id: str, local_id: str) -> str:
        alias = await self.db.run(alias_of, tenant_id, local_id)
        full = alias if alias is not None else scoped_session_id(tenant_id, local_id)
        self._known[(tenant_id, local_id)] = full
        while len(self._known) > self.max_entries:
            self._known.popitem(last=False)
        return full
