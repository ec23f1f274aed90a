"""The garbage collector's settings for a long-running server process (the gateway, the
processor).

With CPython's default thresholds (700, 10, 10) the gateway at 500 POST/s and 200 SSE
clients ran ~1,000 young, ~90 middle and ~9 full collections in 30 s: 2.1-2.9 s of its
~11 s of CPU, each full one 100-115 ms during which no thread of the process runs Python,
so every request and stream in flight waited (docs/decisions/0004-gateway-under-load.md).
Most of what it scanned again and again were the objects made at start (modules, the app,
the clients), which live as long as the process.

The processor draining a backlog allocates ~100 tracked objects per command (the decoded
command, its events, the new state); at the default thresholds the collections took ~13 %
of its CPU per command (docs/decisions/0005-processor-profile.md).
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_collector"]

#: allocations (net of frees) of tracked objects between two young collections (CPython:
#: 700); the objects of one request die before it is reached, so fewer are promoted
YOUNG_THRESHOLD = 10_000


def settle_collector() -> int:
    """Call once the process has started: what exists now is moved out of the collector's
    sight for good (`gc.freeze`), and young collections run every `YOUNG_THRESHOLD`
    allocations. Cycles made later are still collected. Returns how many objects were
    frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 20)
    return gc.get_freeze_count()
