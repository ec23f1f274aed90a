"""The decider is pure: no I/O, no clock, no randomness. These tests fail if any creeps in."""

from __future__ import annotations

import ast
import builtins
import datetime
import functools
import os
import random
import socket
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

import pytest

from sessionstream.schemas.events import RunStarted
from tests.unit._harness import Harness, leased

ROOT = Path(__file__).resolve().parents[3]
PURE = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "sessionstream/core/decider").glob("*.py")),
    "sessionstream/core/state.py",
    "sessionstream/core/timers.py",
    "sessionstream/core/open_runs.py",
    "sessionstream/core/approvals.py",
    "sessionstream/core/cron.py",
]
#: msgspec: the state structs (C, no I/O; chosen for the fold's speed, sessionstream/core/state.py)
ALLOWED = {"__future__", "dataclasses", "typing", "uuid", "hashlib", "pydantic", "msgspec"}
ALLOWED_LOCAL = {
    "sessionstream.core.state",
    "sessionstream.core.cron",
    "sessionstream.errors",
    "sessionstream.core.decider",
    "sessionstream.core.approvals",
}
#: the cron evaluator reads wall-clock times in a zone: datetime's arithmetic and zoneinfo's
#: tz database (never a clock: `datetime.now` is refused by `no_world` below)
CRON = {"sessionstream/core/cron.py"}
CRON_ALLOWED = {"datetime", "zoneinfo", "functools"}
#: the schemas modules the decider may lean on, and what they may import in turn
SCHEMA_ALLOWED = ALLOWED | {"builtins", "pydantic.alias_generators"}
FORBIDDEN_CALLS = {"open", "__import__", "exec", "eval", "compile", "input", "print"}


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            out.add(node.module or "")
    return out


def calls(path: Path) -> set[str]:
    return {
        n.func.id
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }


@pytest.mark.parametrize("rel", PURE)
def test_pure_modules_import_only_pure_things(rel: str) -> None:
    for name in imports(ROOT / rel):
        top = name.split(".")[0]
        ok = (
            top in ALLOWED
            or (rel in CRON and top in CRON_ALLOWED)
            or name.startswith(("sessionstream.schemas.", "sessionstream.core.decider."))
            or name in ALLOWED_LOCAL
        )
        assert ok, f"{rel} imports {name}: the decider must stay free of I/O and clocks"
    assert not calls(ROOT / rel) & FORBIDDEN_CALLS


def test_schema_modules_the_decider_uses_are_pure_too() -> None:
    todo = [
        n for rel in PURE for n in imports(ROOT / rel) if n.startswith("sessionstream.schemas.")
    ]
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = ROOT / (mod.replace(".", "/") + ".py")
        for name in imports(path):
            if name.startswith("sessionstream.schemas."):
                todo.append(name)
            else:
                assert name.split(".")[0] in SCHEMA_ALLOWED or name in SCHEMA_ALLOWED, (mod, name)
        assert not calls(path) & FORBIDDEN_CALLS, mod
    assert "sessionstream.schemas.codec" not in seen  # fastavro and io stay out of the decider
    assert {"sessionstream.schemas.commands", "sessionstream.schemas.events"} <= seen


def _boom(what: str) -> Any:
    def boom(*_a: Any, **_k: Any) -> NoReturn:
        raise AssertionError(f"the decider called {what}")

    return boom


class _NoClock(datetime.datetime):
    now = classmethod(_boom("datetime.now"))  # type: ignore[assignment]
    utcnow = classmethod(_boom("datetime.utcnow"))  # type: ignore[assignment]
    today = classmethod(_boom("datetime.today"))  # type: ignore[assignment]


@pytest.fixture
def no_world(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod, name in [
        (time, "time"),
        (time, "time_ns"),
        (time, "monotonic"),
        (time, "perf_counter"),
        (random, "random"),
        (random, "randint"),
        (uuid, "uuid1"),
        (uuid, "uuid4"),
        (os, "urandom"),
        (socket, "socket"),
        (builtins, "open"),
    ]:
        monkeypatch.setattr(mod, name, _boom(f"{mod.__name__}.{name}"))
    monkeypatch.setattr(datetime, "datetime", _NoClock)


def test_the_patches_bite(no_world: None) -> None:
    """Proof the fixture works: a leaky function really fails under it."""
    for leak in (time.time, uuid.uuid4, datetime.datetime.now, functools.partial(open, __file__)):
        with pytest.raises(AssertionError, match="the decider called"):
            leak()


def test_full_scenario_without_clock_random_or_io(no_world: None) -> None:
    h = Harness()
    leased(h)
    h.work("run.progress", {"kind": "model.request.started", "name": "gpt"})
    h.work("run.progress", {"kind": "tool.started", "name": "web"})
    h.steer()
    h.follow_up("also this")
    h.work("action.request", {"idempotency_key": "k", "kind": "email"})
    h.work("action.result", {"idempotency_key": "k"})
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck"})
    h.fire("lease_expiry")
    h.acquire("w2")
    h.work("run.progress", {"kind": "tool.finished"}, generation=1)  # stale
    h.prompt("next", policy="interrupt")
    h.work("cancel.ack", {"model_request_aborted": True}, worker="w2")
    h.fire("run_deadline")
    h.send("again")
    h.abort()
    types = {e.type for e in h.log}
    assert {
        "run.stale_write_recorded",
        "run.lease_expired",
        "context.checkpointed",
        "action.completed",
        "run.finished",
        "run.follow_up_queued",
    } <= types
    started = [e.payload_as(RunStarted).prompt for e in h.log if e.type == "run.started"]
    # the follow-up went with the interrupted run (dropped, with its fate recorded)
    assert started == ["p0", "next", "again"]
    assert "run.input_dropped" in types and "run.input_delivered" in types


@pytest.fixture
def zones_read() -> None:
    """The tz database is read once per zone, as a module is imported (it is the one outside
    input of schedules: docs/protocol.md#schedules); deciding reads nothing after."""
    from sessionstream.core.cron import zone

    zone("Europe/Lisbon")


def test_schedules_decide_without_clock_random_or_io(zones_read: None, no_world: None) -> None:
    h = Harness()
    h.do("schedule.create", {"schedule_id": "a", "text": "t", "interval_ms": 60_000})
    h.do(
        "schedule.create",
        {"schedule_id": "b", "text": "t", "cron": "*/5 * * * mon-fri", "timezone": "Europe/Lisbon"},
    )
    for _ in range(4):
        h.fire("schedule")
    h.do("schedule.delete", {"schedule_id": "a"})
    assert {e.type for e in h.log} >= {"schedule.created", "schedule.fired", "schedule.deleted"}
