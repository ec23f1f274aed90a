"""Start and stop sessionstream's own processes (used by the demo)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import SecretStr

from sessionstream.settings import Settings

__all__ = ["Service", "cpu_seconds", "settings_env"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """user + system CPU seconds of a live process (all its threads); 0 when gone."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def settings_env(s: Settings) -> dict[str, str]:
    """The environment that gives a subprocess exactly these settings."""
    env = dict(os.environ)
    for name, value in s.model_dump().items():
        key = f"SESSIONSTREAM_{name.upper()}"
        if value is None:
            env.pop(key, None)
        elif isinstance(value, SecretStr):
            # str() of a SecretStr is its mask; the child needs the password itself
            env[key] = value.get_secret_value()
        else:
            env[key] = str(value)
    return env


class Service:
    """One `sessionstream ARGS` subprocess, its output in `log`."""

    def __init__(self, name: str, settings: Settings, args: list[str], log_dir: Path) -> None:
        self.name = name
        self.settings = settings
        self.args = args
        self.log = log_dir / f"{name}.log"
        self.cwd: Path | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        #: the `sessionstream` executable (default: this interpreter's); a benchmark points
        #: it at another checkout's to compare versions on one load
        self.exe: Path | None = None

    def start(self) -> Service:
        exe = self.exe or Path(sys.executable).with_name("sessionstream")
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [str(exe), *self.args],
                env=settings_env(self.settings),
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def cpu(self) -> float:
        return cpu_seconds(self.popen.pid if self.popen else None)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_for(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited; last lines:\n{self.text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {needle!r} within {timeout}s (log {self.log})")
            time.sleep(0.1)

    def kill9(self) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; the exit code (0 if never started)."""
        if self.popen is None:
            return 0
        if self.popen.poll() is not None:
            return self.popen.returncode
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(10)
