"""How the rebuild starts its loader processes: forked only from a single-threaded process."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import threading, time
from sessionstream.runtimes.sink.rebuild import _start_method
before = _start_method()
stop = threading.Event()
t = threading.Thread(target=stop.wait, daemon=True)
t.start()
during = _start_method()
stop.set(); t.join()
deadline = time.monotonic() + 10  # a joined thread's OS thread may still be exiting
while (after := _start_method()) != "fork" and time.monotonic() < deadline:
    time.sleep(0.01)
print(before, during, after)
"""


def test_a_second_thread_means_spawn_and_its_end_means_fork_again() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["fork", "spawn", "fork"]
