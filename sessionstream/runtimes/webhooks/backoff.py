"""When a failed delivery is tried again: exponential back-off with jitter, bounded."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all; after the n-th failure the next waits between half and all
    of ``min(first_s * 2**(n-1), max_s)`` ("equal jitter": never sooner than half, so a
    flood of failures cannot come back at once, and never all at the same moment)."""

    attempts: int
    first_s: float
    max_s: float

    def ceiling(self, failures: int) -> float:
        """The longest wait after `failures` failed attempts (1, 2, ...)."""
        # min() before the power would overflow: 2**1000 is no float
        return min(self.first_s * 2.0 ** min(failures - 1, 60), self.max_s)

    def delay(
        self, failures: int, retry_after: float | None = None, rnd: random.Random | None = None
    ) -> float:
        """Seconds to wait after `failures` failed attempts; a receiver's ``Retry-After``
        is waited at least (up to `max_s`)."""
        top = self.ceiling(failures)
        wait = top / 2 + (rnd or random).random() * top / 2
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_s))
        return wait

    def gives_up(self, failures: int) -> bool:
        """No attempt is left after `failures` failed ones."""
        return failures >= self.attempts

    def span(self) -> tuple[float, float]:
        """The shortest and longest time from the first attempt to the last (the waits
        only, not the attempts' own durations)."""
        waits = [self.ceiling(n) for n in range(1, self.attempts)]
        return sum(waits) / 2, sum(waits)
