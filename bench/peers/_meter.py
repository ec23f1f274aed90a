"""Per-process CPU seconds and RSS from /proc, and the load average, around one phase."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench._harness import machine_busy

TICKS = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree(pid: int) -> list[int]:
    """`pid` and its live descendants (a server that forks workers counts whole)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _stat(pid: int) -> tuple[float, float, float]:
    """(CPU seconds, RSS MiB, peak RSS MiB) of one process; zeros when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0, 0.0, 0.0
    rss = hwm = 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return (int(fields[11]) + int(fields[12])) / TICKS, rss, hwm


def sample(pid: int) -> tuple[float, float, float]:
    """`_stat` summed over the process tree of `pid`."""
    cpu = rss = hwm = 0.0
    for p in tree(pid):
        c, r, h = _stat(p)
        cpu, rss, hwm = cpu + c, rss + r, hwm + h
    return cpu, rss, hwm


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class PhaseMeter:
    """CPU used by each named process (and this driver, and the machine) between
    `__init__` and `read()`; RSS and peak RSS at `read()`; load average at both ends."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = dict(procs, driver=os.getpid())
        self.cpu0 = {n: self._sample(n, p)[0] for n, p in self.procs.items()}
        self.t0, self.m0, self.load0 = time.perf_counter(), machine_busy()[0], loadavg()

    @staticmethod
    def _sample(name: str, pid: int) -> tuple[float, float, float]:
        # the driver alone: the systems' servers are its children (their trees are
        # measured under their own names), and counting them twice made the driver look
        # busier than the systems it drove
        return _stat(pid) if name == "driver" else sample(pid)

    def read(self, commands: int) -> dict[str, Any]:
        secs = time.perf_counter() - self.t0
        per: dict[str, Any] = {}
        for name, pid in self.procs.items():
            cpu, rss, hwm = self._sample(name, pid)
            per[name] = {
                "cpu_s": round(cpu - self.cpu0[name], 2),
                "rss_mb": round(rss, 1),
                "peak_rss_mb": round(hwm, 1),
            }
        system = [n for n in per if n != "driver"]
        cpu_system = sum(per[n]["cpu_s"] for n in system)
        return {
            "seconds": round(secs, 2),
            "loadavg_start": self.load0,
            "loadavg_end": loadavg(),
            "machine_busy_cores": round((machine_busy()[0] - self.m0) / secs, 2),
            "processes": per,
            "system_cpu_s": round(cpu_system, 2),
            "system_rss_mb": round(sum(per[n]["rss_mb"] for n in system), 1),
            "cpu_ms_per_command": round(1000 * cpu_system / commands, 3) if commands else None,
            "driver_cpu_ms_per_command": (
                round(1000 * per["driver"]["cpu_s"] / commands, 3) if commands else None
            ),
        }
