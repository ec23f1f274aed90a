"""What one caller may hold of the gateway: open event streams per key and per tenant, and
the requests one client address makes without a key the gateway knows.

Answers past a limit are ``429`` with ``Retry-After``. Connection counts and timeouts
are the protocol's (`protocol`); the per-key request rate is the authenticator's.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from sessionstream.apps.gateway.errors import ApiError

__all__ = ["AddressBuckets", "StreamCounts", "TokenBucket"]


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

    def give_back(self) -> None:
        """Return a token taken for what turned out not to need one."""
        self.tokens = min(self.burst, self.tokens + 1)


def too_many(message: str, wait_s: float) -> ApiError:
    return ApiError(
        429, "rate_limited", message, headers={"Retry-After": str(max(1, math.ceil(wait_s)))}
    )


class AddressBuckets:
    """A token bucket per client address, the least recently used forgotten past
    `max_addresses` (a flood of addresses costs memory up to that bound only)."""

    def __init__(self, rate: float, burst: int, max_addresses: int = 50_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_addresses = max_addresses
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, address: str) -> float:
        bucket = self._buckets.get(address)
        if bucket is None:
            bucket = self._buckets[address] = TokenBucket(self.rate, self.burst)
            while len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(address)
        return bucket.take()

    def give_back(self, address: str) -> None:
        bucket = self._buckets.get(address)
        if bucket is not None:
            bucket.give_back()


class StreamCounts:
    """Open event streams per key and per tenant. `open` counts one or raises 429;
    the callable it returns gives it back (once, however often it is called)."""

    def __init__(self, per_key: int, per_tenant: int) -> None:
        self.per_key = per_key
        self.per_tenant = per_tenant
        self.keys: Counter[str] = Counter()
        self.tenants: Counter[str] = Counter()

    def open(self, key_id: str, tenant_id: str) -> Callable[[], None]:
        if self.keys[key_id] >= self.per_key:
            raise too_many(f"more than {self.per_key} open event streams with this key", 5)
        if self.tenants[tenant_id] >= self.per_tenant:
            raise too_many(f"more than {self.per_tenant} open event streams of this tenant", 5)
        self.keys[key_id] += 1
        self.tenants[tenant_id] += 1
        done = [False]

        def close() -> None:
            if done[0]:
                return
            done[0] = True
            for counts, name in ((self.keys, key_id), (self.tenants, tenant_id)):
                counts[name] -= 1
                if counts[name] <= 0:
                    del counts[name]

        return close
