"""The gateway's collector settings: start-up objects frozen, young collections rarer, and
cycles made afterwards still collected. Run in a child interpreter: the test runner's own
collector is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys

_CHILD = """
import gc, json, weakref
from sessionstream.adapters._gc import YOUNG_THRESHOLD, settle_collector

before = gc.get_freeze_count()
reported = settle_collector()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a          # a cycle made after the settle
alive = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({
    "frozen_before": before,
    "frozen": gc.get_freeze_count(),
    "reported": reported,
    "threshold": list(gc.get_threshold()),
    "young": YOUNG_THRESHOLD,
    "cycle_collected": alive() is None,
}))
"""


def test_settle_freezes_start_up_objects_and_still_collects_later_cycles() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout)
    assert got["frozen_before"] == 0
    assert got["frozen"] > 1000  # the interpreter's and the imports' objects
    assert got["reported"] == got["frozen"]
    assert got["threshold"] == [got["young"], 20, 20]
    assert got["young"] > 700  # rarer than CPython's default
    assert got["cycle_collected"]
