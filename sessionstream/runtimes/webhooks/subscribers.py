"""The subscriptions as the deliverer sees them: read from PostgreSQL, secrets opened, and
which of them an event goes to."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sessionstream.runtimes.webhooks.dispatch import Target
from sessionstream.runtimes.webhooks.filters import matches
from sessionstream.runtimes.webhooks.sealing import SealedSecrets
from sessionstream.runtimes.webhooks.signing import secret_bytes
from sessionstream.runtimes.webhooks.store import Subscription
from sessionstream.schemas.events import Event

__all__ = ["Snapshot"]


@dataclass(frozen=True)
class _Endpoint:
    sub: Subscription
    target: Target


@dataclass(frozen=True)
class Snapshot:
    """The live subscriptions read at `taken_at` (time.monotonic, when the query began)."""

    taken_at: float = float("-inf")
    by_tenant: dict[str, list[_Endpoint]] = field(default_factory=dict)
    #: `store.live_fingerprint` of what it holds
    fingerprint: str = ""

    @classmethod
    def of(
        cls,
        rows: Iterable[tuple[Subscription, bytes]],
        sealer: SealedSecrets,
        taken_at: float,
        fingerprint: str = "",
    ) -> Snapshot:
        """From `store.live_subscriptions`' rows; a secret no configured key opens is a
        `ConfigurationError` (a deliverer with another key than the gateway's)."""
        by_tenant: dict[str, list[_Endpoint]] = {}
        for sub, sealed in rows:
            secret = secret_bytes(sealer.open(sealed, sub.subscription_id))
            target = Target(sub.subscription_id, sub.url, secret)
            by_tenant.setdefault(sub.tenant_id, []).append(_Endpoint(sub, target))
        return cls(taken_at, by_tenant, fingerprint)

    def still(self, taken_at: float) -> Snapshot:
        """The same subscriptions, known to be current at `taken_at`."""
        return replace(self, taken_at=taken_at)

    @classmethod
    def empty(cls) -> Snapshot:
        return cls()

    @property
    def ids(self) -> set[str]:
        return {e.sub.subscription_id for eps in self.by_tenant.values() for e in eps}

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.taken_at

    def targets(self, event: Event, partition: int, offset: int) -> list[Target]:
        """The endpoints `event` (at `partition`/`offset`) goes to: its tenant's
        subscriptions that want its type and were made before it was appended."""
        out = []
        for e in self.by_tenant.get(event.tenant_id, ()):
            if offset < e.sub.start_offsets.get(partition, 0):
                continue
            if matches(e.sub.event_types, event.type):
                out.append(e.target)
        return out
