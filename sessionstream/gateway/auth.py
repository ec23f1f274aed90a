"""Who is calling: the API key of a request, its tenant and actor, and its rate.

Keys come as ``Authorization: Bearer ssk_...`` (or ``X-API-Key``). What the database says
about a key is cached for `gateway_key_cache_s` (a revoked key stops working within that
time; an unknown key is remembered as unknown just as long, so a flood of bad keys does
not become a flood of queries). Each key has a token bucket: `gateway_rate_per_s` on
average, `gateway_rate_burst` at once; beyond it a request is answered 429 with
``Retry-After``.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from sessionstream.errors import DatabaseUnavailable
from sessionstream.gateway._flight import SingleFlight
from sessionstream.gateway.db import Database
from sessionstream.gateway.errors import ApiError
from sessionstream.gateway.keys import ApiKey, lookup_key, parse_key
from sessionstream.settings import Settings

__all__ = ["Authenticator", "Principal", "TokenBucket"]

_CACHE_MAX = 10_000


@dataclass(frozen=True)
class Principal:
    """The caller, as its key says: every command it sends is `tenant_id`'s, by `actor`."""

    key_id: str
    tenant_id: str
    actor: str


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> float:
        """0 if a token was taken, else the seconds until one is there."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Authenticator:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.db = db
        self.ttl = settings.gateway_key_cache_s
        self.rate = settings.gateway_rate_per_s
        self.burst = settings.gateway_rate_burst
        self._cache: OrderedDict[str, tuple[float, ApiKey | None]] = OrderedDict()
        self._buckets: dict[str, TokenBucket] = {}
        # one query per key at a time: when an entry expires under load, the requests
        # that find it expired wait for the same lookup instead of each sending one
        self._flight: SingleFlight[str, ApiKey | None] = SingleFlight()

    async def principal(self, authorization: str | None, x_api_key: str | None) -> Principal:
        """The caller of a request with these headers; `ApiError` 401 or 429 otherwise."""
        key = _presented(authorization, x_api_key)
        if key is None:
            raise ApiError(401, "unauthorized", "an API key is required (Authorization: Bearer)")
        found = await self._lookup(key)
        if found is None:
            raise ApiError(401, "unauthorized", "unknown or revoked API key")
        bucket = self._buckets.get(found.key_id)
        if bucket is None:
            bucket = self._buckets[found.key_id] = TokenBucket(self.rate, self.burst)
        wait = bucket.take()
        if wait > 0:
            raise ApiError(
                429,
                "rate_limited",
                f"more than {self.rate:g} requests/s (burst {self.burst}) with this key",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        return Principal(found.key_id, found.tenant_id, found.actor)

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
