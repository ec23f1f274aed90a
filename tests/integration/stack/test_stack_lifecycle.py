"""`make up` is idempotent, and `make down` then `make up` brings the stack back.

Runs against whatever the settings name: the local stack this repository starts, or a user's
own server already answering on the local ports (then `down` must leave it alone). Skipped,
with the reason printed, only when SESSIONSTREAM_KAFKA_BOOTSTRAP points elsewhere, because
`make up/down` manage nothing there. The stack is always left up.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from sessionstream.settings import Settings
from stack.probe import (
    NotAnswering,
    NotListening,
    is_local_kafka,
    is_local_postgres,
    kafka_answers,
    postgres_answers,
)
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
FOREIGN = "not started by sessionstream"


def _make(target: str) -> str:
    started = time.monotonic()
    proc = subprocess.run(
        ["make", "--no-print-directory", target],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = proc.stdout + proc.stderr
    print(f"$ make {target}  ({time.monotonic() - started:.1f}s)\n{output}")
    assert proc.returncode == 0, f"make {target} exited {proc.returncode}:\n{output}"
    return output


def _lines(output: str, service: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"{service}: ")]


def _pid(output: str, service: str) -> int:
    pids = [int(m) for line in _lines(output, service) for m in re.findall(r"\(pid (\d+)", line)]
    assert pids, f"no pid for {service} in:\n{output}"
    return pids[-1]


def _answers(check: object) -> bool:
    try:
        check()  # type: ignore[operator]
    except (NotListening, NotAnswering):
        return False
    return True


def test_make_up_twice_is_a_noop_and_down_up_restarts(settings: Settings) -> None:
    if not is_local_kafka(settings.kafka_bootstrap):
        reason = (
            f"SESSIONSTREAM_KAFKA_BOOTSTRAP={settings.kafka_bootstrap} is not the local stack's "
            "address; make up/down do not manage that broker"
        )
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    local_pg = is_local_postgres(settings.database_url)

    def kafka_ok() -> bool:
        return _answers(lambda: kafka_answers(settings.kafka_bootstrap, timeout=3))

    def pg_ok() -> bool:
        return _answers(lambda: postgres_answers(settings.database_url, timeout=3))

    restored = False
    try:
        first = _make("up")
        second = _make("up")

        # Second `up`: nothing started, the same processes still serve.
        assert "started" not in second and "formatting" not in second and "initdb" not in second
        (kafka_line,) = _lines(second, "kafka")
        kafka_ours = FOREIGN not in kafka_line
        if kafka_ours:
            assert "already running" in kafka_line
            assert _pid(second, "kafka") == _pid(first, "kafka")
        (pg_line,) = _lines(second, "postgres")
        pg_ours = local_pg and FOREIGN not in pg_line
        if pg_ours:
            assert "already running" in pg_line
            assert _pid(second, "postgres") == _pid(first, "postgres")

        # `down` stops what `up` started, and only that.
        down = _make("down")
        if kafka_ours:
            assert f"kafka: stopped (pid {_pid(first, 'kafka')})" in down
            wait_until(lambda: not kafka_ok(), timeout=30, what="Kafka to stop answering")
        else:
            assert "left alone" in _lines(down, "kafka")[0] and kafka_ok()
        if pg_ours:
            assert f"postgres: stopped (pid {_pid(first, 'postgres')})" in down
            wait_until(lambda: not pg_ok(), timeout=30, what="PostgreSQL to stop answering")
        else:
            assert pg_ok()

        # `up` after `down` starts again and returns only once both answer.
        again = _make("up")
        restored = True
        if kafka_ours:
            assert "kafka: started" in again and "kafka: ready" in again
        if pg_ours:
            assert "postgres: ready" in again
        assert kafka_ok() and pg_ok()
    finally:
        if not restored:
            _make("up")
