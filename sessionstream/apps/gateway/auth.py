"""Who is calling: the API key of a request, its tenant and actor, and its rate.

Keys come as ``Authorization: Bearer ssk_...`` (or ``X-API-Key``). What the database says
about a key is cached for `gateway_key_cache_s` (a revoked key stops working within that
time; an unknown key is remembered as unknown just as long). Each key has a token
bucket: `gateway_rate_per_s` on average, `gateway_rate_burst` at once; beyond it a
request is answered 429 with ``Retry-After``.

A request without a key the cache knows to be live (no key, a malformed or unknown one,
or one that must be looked up; a lookup that finds a live key gives it back) takes a
token of its client address's bucket
(`gateway_unauthenticated_per_s`), so a flood of made-up keys is refused 429 before it
becomes a flood of queries; and at most half of the database connections look keys up
at once, so the other queries always have connections.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

from sessionstream.apps.gateway._flight import SingleFlight
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.keys import ApiKey, lookup_key, parse_key
from sessionstream.apps.gateway.limits import AddressBuckets, TokenBucket, too_many
from sessionstream.errors import DatabaseUnavailable
from sessionstream.settings import Settings

__all__ = ["Authenticator", "Principal"]

_CACHE_MAX = 10_000


@dataclass(frozen=True)
class Principal:
    """The caller, as its key says: every command it sends is `tenant_id`'s, by `actor`."""

    key_id: str
    tenant_id: str
    actor: str
    #: the key's role: `admin` keys may erase the tenant's sessions
    role: str = "producer"


class Authenticator:
    def __init__(self, settings: Settings, db: Database, *, lookups: int = 4) -> None:
        self.db = db
        self.ttl = settings.gateway_key_cache_s
        self.rate = settings.gateway_rate_per_s
        self.burst = settings.gateway_rate_burst
        self._cache: OrderedDict[str, tuple[float, ApiKey | None]] = OrderedDict()
        self._buckets: dict[str, TokenBucket] = {}
        self._addresses = AddressBuckets(
            settings.gateway_unauthenticated_per_s, settings.gateway_unauthenticated_burst
        )
        self._lookups = asyncio.Semaphore(lookups)
        #: key lookups that reached the database (for /healthz and the abuse tests)
        self.queries = 0
        # one query per key at a time: when an entry expires under load, the requests
        # that find it expired wait for the same lookup instead of each sending one
        self._flight: SingleFlight[str, ApiKey | None] = SingleFlight()

    async def principal(
        self, authorization: str | None, x_api_key: str | None, address: str | None = None
    ) -> Principal:
        """The caller of a request with these headers from client `address`; `ApiError`
        401 or 429 otherwise."""
        key = _presented(authorization, x_api_key)
        found = self._cached(key) if key is not None else None
        if found is None:
            # the no-valid-key bucket is for keys not known to be live: a live key whose
            # cache entry just expired is revalidated (one lookup for all its requests)
            # without a token, or its owner's burst would be refused 429 at every refresh
            charged = address is not None and not (key is not None and self._was_live(key))
            if charged:
                assert address is not None
                wait = self._addresses.take(address)
                if wait > 0:
                    raise too_many(
                        "too many requests without a valid API key from this address", wait
                    )
            if key is None:
                raise ApiError(
                    401, "unauthorized", "an API key is required (Authorization: Bearer)"
                )
            found = await self._lookup(key)
            if found is not None and charged:
                assert address is not None
                self._addresses.give_back(address)  # a live key: not what the bucket is for
        if found is None:
            raise ApiError(401, "unauthorized", "unknown or revoked API key")
        bucket = self._buckets.get(found.key_id)
        if bucket is None:
            bucket = self._buckets[found.key_id] = TokenBucket(self.rate, self.burst)
        wait = bucket.take()
        if wait > 0:
            raise too_many(
                f"more than {self.rate:g} requests/s (burst {self.burst}) with this key", wait
            )
        return Principal(found.key_id, found.tenant_id, found.actor, found.role)

    def _was_live(self, key: str) -> bool:
        """The cache's last word on `key`, expired or not, was a live key."""
        hit = self._cache.get(key)
        return hit is not None and hit[1] is not None

    def _cached(self, key: str) -> ApiKey | None:
        """The live key the cache holds for `key` (None: not known to be live now)."""
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            self._cache.move_to_end(key)
            return hit[1]
        return None

    async def still_valid(self, authorization: str | None, x_api_key: str | None) -> bool:
        """The key of these headers is still live (no rate-limit token taken): what an open
        stream asks every `gateway_key_cache_s`. A database that does not answer keeps
        the stream (an outage is not a revocation)."""
        key = _presented(authorization, x_api_key)
        if key is None:
            return False
        try:
            return await self._lookup(key) is not None
        except DatabaseUnavailable:
            return True

    async def _lookup(self, key: str) -> ApiKey | None:
        if parse_key(key) is None:
            return None
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            # least recently used goes first: a flood of new keys (each unknown one is
            # remembered too) no longer pushes out the keys in use
            self._cache.move_to_end(key)
            return hit[1]
        return await self._flight.do(key, lambda: self._fetch(key))

    async def _fetch(self, key: str) -> ApiKey | None:
        async with self._lookups:
            self.queries += 1
            found = await self.db.run(lookup_key, key)
        self._cache[key] = (time.monotonic() + self.ttl, found)
        self._cache.move_to_end(key)
        while len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)
        return found


def _presented(authorization: str | None, x_api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    return x_api_key.strip() if x_api_key else None
