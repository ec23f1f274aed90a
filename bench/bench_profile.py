"""Where the processor's time goes: py-spy over one processor draining a backlog.

A backlog of `--commands` (the `bench/_harness.py` cycle on 1,000 sessions) is produced,
one processor drains it, and `py-spy record` (raw collapsed stacks, 200 Hz, `--nonblocking`)
samples it for `--seconds` once it is under way. Printed: the processing rate while sampled,
then the inclusive and self shares of the frames under the processor's loop.

    .venv/bin/pip install py-spy
    .venv/bin/python -m bench.bench_profile [--commands 60000] [--seconds 12] [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._harness import Offsets, Processor, Workload, delete_topics_and_groups
from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings


def summarize(raw: Path, top: int) -> None:
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n, frames = int(count), stack.split(";")
        if not any("sessionstream/runtimes/processor/loop.py" in f for f in frames):
            continue
        total += n
        self_t[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    print(f"samples under the loop: {total}")
    print("--- inclusive")
    for f, n in incl.most_common(top):
        print(f"{100 * n / total:5.1f}% {f}")
    print("--- self")
    for f, n in self_t.most_common(top // 2):
        print(f"{100 * n / total:5.1f}% {f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--commands", type=int, default=60_000)
    ap.add_argument("--seconds", type=int, default=12)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--raw", type=Path, help="also keep py-spy's raw collapsed stacks here")
    args = ap.parse_args(argv)
    spy_exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    s = isolated_settings(Settings(), "profile", prefix="bench", schema=False)
    with SessionClient("bench", s) as c:
        work = Workload(c, "prof", 1000)
        for i in range(args.commands):
            c.submit(work.next(), track=False)
            if i % 20_000 == 0:
                c.flush()
        c.flush(120)
    offsets = Offsets(s)
    end = offsets.end()
    proc = Processor(s, "profile-0").start()
    raw = Path(tempfile.mkstemp(prefix="processor-profile-", suffix=".txt")[1])
    try:
        offsets.wait(lambda c: sum(c.values()) > 2000, proc)
        t0, c0 = time.perf_counter(), sum(offsets.committed().values())
        spy = [spy_exe, "record", "-p", str(proc.pid), "-d", str(args.seconds), "-r", "200"]
        subprocess.run(
            [*spy, "-f", "raw", "-o", str(raw), "--nonblocking"],
            check=True,
            capture_output=True,
        )
        t1, c1 = time.perf_counter(), sum(offsets.committed().values())
        print(f"commands/s while sampled: {round((c1 - c0) / (t1 - t0))}")
        offsets.wait(lambda c: all(c[p] >= o for p, o in end.items()), proc, timeout=600)
        summarize(raw, args.top)
        if args.raw:
            shutil.copyfile(raw, args.raw)
    finally:
        proc.kill9()
        offsets.close()
        delete_topics_and_groups(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
