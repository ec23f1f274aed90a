"""Session ids are namespaced by tenant: tenant ``acme``'s session ``s1`` is ``acme:s1``.

The namespace is everything before the first ``:``; what follows is the tenant's own id.
Two tenants may use the same own id (``acme:s1``, ``globex:s1``): they are two sessions,
on whatever partitions their full ids hash to, with two states and two event logs. The
full id is what travels everywhere (the commands' Kafka key, ``sessionId`` of commands
and events, the event key ``{sessionId}/{runId}/{seq}``, the PostgreSQL rows), so the
single-writer protocol needs nothing new: one full id, one partition, one writer.

Rules on a producer command (a schema violation, so a dead letter, otherwise):
- ``sessionId`` never contains ``/``, the event key's separator: an id that did would be
  a prefix path of another session's events (``X/y/...`` under ``X``);
- a ``sessionId`` with a ``:`` belongs to the tenant before it: a command of any other
  tenant names a session outside its namespace.

An id without ``:`` is unscoped, as every id was before namespaces (sessions of that
time keep their ids); the first tenant to start a run in it owns it (`tenant_mismatch`).
A tenant id with ``:`` cannot own scoped sessions (its namespace would be ambiguous).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_SESSION_ID_CHARS",
    "NAMESPACE_SEP",
    "local_session_id",
    "scoped_session_id",
    "session_id_problem",
]

#: between a session id's namespace (its tenant) and the tenant's own id
NAMESPACE_SEP: Final = ":"

#: longest full session id: a tenant (200), the separator and the tenant's own id (200)
MAX_SESSION_ID_CHARS: Final = 2 * 200 + 1


def scoped_session_id(tenant_id: str, local_id: str) -> str:
    """The full id of `tenant_id`'s session `local_id` (`ValueError` if the tenant id has
    the separator: its sessions could not be told from another tenant's)."""
    if NAMESPACE_SEP in tenant_id:
        raise ValueError(f"tenant id {tenant_id!r} contains {NAMESPACE_SEP!r}: it has no namespace")
    return f"{tenant_id}{NAMESPACE_SEP}{local_id}"


def local_session_id(tenant_id: str, session_id: str) -> str:
    """The tenant's own id of a full session id (an unscoped id is its own)."""
    prefix = f"{tenant_id}{NAMESPACE_SEP}"
    return session_id[len(prefix) :] if session_id.startswith(prefix) else session_id


def session_id_problem(tenant_id: str, session_id: str) -> str | None:
    """Why a producer command of `tenant_id` may not name `session_id`, or None."""
    if "/" in session_id:
        return (
            f"sessionId {session_id!r} contains '/', the event key's separator "
            "(its events would sort under another session's key prefix)"
        )
    if NAMESPACE_SEP in session_id:
        namespace = session_id.partition(NAMESPACE_SEP)[0]
        if namespace != tenant_id:
            return (
                f"sessionId {session_id!r} is in tenant {namespace!r}'s namespace, "
                f"not {tenant_id!r}'s"
            )
    return None
