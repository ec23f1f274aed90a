"""Subscriptions and dead letters in PostgreSQL (migration 0012): what the gateway and the
CLI create, list and delete, and what the deliverer reads and records.

Calls take a connection (the gateway runs them in its database threads, the CLI on its
own connection, the deliverer on its reconnecting one) and end their transaction.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import psycopg
from psycopg.types.json import Jsonb

from sessionstream.errors import SessionstreamError
from sessionstream.runtimes.webhooks.dispatch import DeadLetter
from sessionstream.runtimes.webhooks.filters import check_patterns
from sessionstream.runtimes.webhooks.guard import check_url
from sessionstream.runtimes.webhooks.sealing import SealedSecrets
from sessionstream.runtimes.webhooks.signing import new_secret, secret_hash

__all__ = [
    "MAX_PER_TENANT",
    "DeadLetterRow",
    "Subscription",
    "TooManySubscriptions",
    "create_subscription",
    "delete_subscription",
    "forget_dead_letters",
    "get_subscription",
    "list_dead_letters",
    "list_subscriptions",
    "live_fingerprint",
    "live_subscriptions",
    "record_dead_letter",
]

#: live subscriptions one tenant may have (each is a copy of its events to send)
MAX_PER_TENANT: Final = 50
_ID_PREFIX: Final = "wh_"
_MAX_TEXT: Final = 200
#: the secret's characters kept in the clear: enough to tell two apart, not to guess one
_SHOWN: Final = len("whsec_") + 4


class TooManySubscriptions(SessionstreamError):
    """The tenant has `MAX_PER_TENANT` live subscriptions already."""


@dataclass(frozen=True)
class Subscription:
    """A tenant's webhook: where its events of these types go, from which offsets on."""

    subscription_id: str
    tenant_id: str
    url: str
    event_types: tuple[str, ...]
    description: str | None
    secret_prefix: str
    created_at: datetime
    #: events partition -> first offset it is sent (the topic's end when it was made)
    start_offsets: dict[int, int] = field(default_factory=dict)
    deleted_at: datetime | None = None

    def json(self) -> dict[str, Any]:
        """As the gateway and `webhooks list --json` show it (never the secret)."""
        return {
            "id": self.subscription_id,
            "tenantId": self.tenant_id,
            "url": self.url,
            "eventTypes": list(self.event_types),
            "description": self.description,
            "secretPrefix": self.secret_prefix,
            "createdAt": self.created_at.isoformat(),
        }


_COLUMNS = (
    "subscription_id, tenant_id, url, event_types, description, secret_prefix, created_at,"
    " start_offsets, deleted_at"
)


def _sub(r: tuple[Any, ...]) -> Subscription:
    sid, tenant, url, types, desc, prefix, created, starts, deleted = r
    return Subscription(
        sid,
        tenant,
        url,
        tuple(types),
        desc,
        prefix,
        created,
        {int(p): int(o) for p, o in (starts or {}).items()},
        deleted,
    )


def create_subscription(
    conn: psycopg.Connection[Any],
    sealer: SealedSecrets,
    tenant_id: str,
    url: str,
    event_types: list[str],
    start_offsets: dict[int, int],
    description: str | None = None,
) -> tuple[str, Subscription]:
    """A new subscription: returns its secret (to show once) and its record. The URL's
    form is checked here; its addresses (which need resolving) are the caller's to check
    (`guard.checked_addresses`). ValueError for bad input, `TooManySubscriptions` past
    the tenant's limit."""
    if not 1 <= len(tenant_id) <= _MAX_TEXT:
        raise ValueError(f"tenant must be 1-{_MAX_TEXT} characters")
    if description is not None and len(description) > _MAX_TEXT:
        raise ValueError(f"description has at most {_MAX_TEXT} characters")
    check_url(url)
    patterns = check_patterns(event_types)
    secret = new_secret()
    try:
        # one tenant's creations one at a time (until the commit): the count is exact
        conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (f"webhooks:{tenant_id}",))
        row = conn.execute(
            "select count(*) from webhook_subscriptions where tenant_id = %s"
            " and deleted_at is null",
            (tenant_id,),
        ).fetchone()
        if row is not None and int(row[0]) >= MAX_PER_TENANT:
            raise TooManySubscriptions(
                f"tenant {tenant_id} has {MAX_PER_TENANT} webhooks already; delete one first"
            )
        while True:
            sid = _ID_PREFIX + secrets.token_hex(8)
            got = conn.execute(
                "insert into webhook_subscriptions (subscription_id, tenant_id, url,"
                " event_types, description, secret_prefix, secret_hash, secret_sealed,"
                " start_offsets) values (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                f" on conflict (subscription_id) do nothing returning {_COLUMNS}",
                (
                    sid,
                    tenant_id,
                    url,
                    patterns,
                    description,
                    secret[:_SHOWN],
                    secret_hash(secret),
                    sealer.seal(secret, sid),
                    Jsonb({str(p): o for p, o in start_offsets.items()}),
                ),
            ).fetchone()
            if got is not None:  # else: a 64-bit id collision, draw again
                conn.commit()
                return secret, _sub(got)
    except BaseException:
        conn.rollback()
        raise


def list_subscriptions(
    conn: psycopg.Connection[Any], tenant_id: str | None = None
) -> list[Subscription]:
    """Live subscriptions (of one tenant), oldest first."""
    sql = f"select {_COLUMNS} from webhook_subscriptions where deleted_at is null"
    rows = (
        conn.execute(f"{sql} and tenant_id = %s order by created_at", (tenant_id,))
        if tenant_id is not None
        else conn.execute(f"{sql} order by created_at")
    ).fetchall()
    conn.rollback()
    return [_sub(r) for r in rows]


def get_subscription(
    conn: psycopg.Connection[Any], subscription_id: str, tenant_id: str | None = None
) -> Subscription | None:
    """A live subscription (only if it is `tenant_id`'s, when given)."""
    row = conn.execute(
        f"select {_COLUMNS} from webhook_subscriptions where subscription_id = %s"
        " and deleted_at is null",
        (subscription_id,),
    ).fetchone()
    conn.rollback()
    if row is None:
        return None
    sub = _sub(row)
    return None if tenant_id is not None and sub.tenant_id != tenant_id else sub


def delete_subscription(
    conn: psycopg.Connection[Any], subscription_id: str, tenant_id: str | None = None
) -> bool:
    """Delete a live subscription (only `tenant_id`'s, when given): its secret is dropped,
    its row and dead letters stay. False when there is no such live subscription."""
    row = conn.execute(
        "update webhook_subscriptions set deleted_at = now(), secret_sealed = null"
        " where subscription_id = %s and deleted_at is null"
        " and (%s::text is null or tenant_id = %s) returning subscription_id",
        (subscription_id, tenant_id, tenant_id),
    ).fetchone()
    conn.commit()
    return row is not None


def live_subscriptions(
    conn: psycopg.Connection[Any],
) -> list[tuple[Subscription, bytes]]:
    """Every live subscription with its sealed secret: what the deliverer delivers to."""
    rows = conn.execute(
        f"select {_COLUMNS}, secret_sealed from webhook_subscriptions"
        " where deleted_at is null order by created_at"
    ).fetchall()
    conn.rollback()
    return [(_sub(r[:-1]), bytes(r[-1])) for r in rows]


def live_fingerprint(conn: psycopg.Connection[Any]) -> str:
    """What identifies the live subscriptions (their ids: a row never changes but to be
    deleted), so a reader asks this small question before reading them all again."""
    row = conn.execute(
        "select count(*) || ':' || coalesce(md5(string_agg(subscription_id, ','"
        " order by subscription_id)), '') from webhook_subscriptions where deleted_at is null"
    ).fetchone()
    conn.rollback()
    return str(row[0]) if row else ""


def record_dead_letter(conn: psycopg.Connection[Any], dead: DeadLetter) -> None:
    """Write (or, for an event buried again, replace) a dead letter."""
    job = dead.job
    conn.execute(
        "insert into webhook_dead_letters (subscription_id, event_id, event_type, session_id,"
        " partition, kafka_offset, attempts, last_status, last_error)"
        " values (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " on conflict (subscription_id, event_id) do update set attempts = excluded.attempts,"
        " last_status = excluded.last_status, last_error = excluded.last_error,"
        " partition = excluded.partition, kafka_offset = excluded.kafka_offset,"
        " dead_at = now()",
        (
            dead.subscription_id,
            job.event_id,
            job.event_type,
            job.session_id,
            job.partition,
            job.offset,
            dead.attempts,
            dead.last_status,
            dead.last_error[:2000],
        ),
    )
    conn.commit()


@dataclass(frozen=True)
class DeadLetterRow:
    """A dead letter as stored."""

    subscription_id: str
    event_id: str
    event_type: str
    session_id: str
    partition: int
    offset: int
    attempts: int
    last_status: int | None
    last_error: str
    dead_at: datetime

    def json(self) -> dict[str, Any]:
        return {
            "subscriptionId": self.subscription_id,
            "eventId": self.event_id,
            "eventType": self.event_type,
            "sessionId": self.session_id,
            "partition": self.partition,
            "offset": self.offset,
            "attempts": self.attempts,
            "lastStatus": self.last_status,
            "lastError": self.last_error,
            "deadAt": self.dead_at.isoformat(),
        }


def list_dead_letters(
    conn: psycopg.Connection[Any],
    subscription_id: str,
    tenant_id: str | None = None,
    limit: int = 100,
) -> list[DeadLetterRow]:
    """A subscription's dead letters in log order (only `tenant_id`'s, when given)."""
    rows = conn.execute(
        "select d.subscription_id, d.event_id, d.event_type, d.session_id, d.partition,"
        " d.kafka_offset, d.attempts, d.last_status, d.last_error, d.dead_at"
        " from webhook_dead_letters d join webhook_subscriptions s using (subscription_id)"
        " where d.subscription_id = %s and (%s::text is null or s.tenant_id = %s)"
        " order by d.partition, d.kafka_offset limit %s",
        (subscription_id, tenant_id, tenant_id, limit),
    ).fetchall()
    conn.rollback()
    return [DeadLetterRow(*r) for r in rows]


def forget_dead_letters(
    conn: psycopg.Connection[Any], subscription_id: str, event_ids: list[str]
) -> int:
    """Delete the dead letters of these events (delivered since); how many were."""
    if not event_ids:
        return 0
    cur = conn.execute(
        "delete from webhook_dead_letters where subscription_id = %s and event_id = any(%s)",
        (subscription_id, event_ids),
    )
    conn.commit()
    return cur.rowcount
