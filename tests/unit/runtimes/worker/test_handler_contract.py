"""What an agent author may hand the worker, and what becomes of what it returns: a plain
`def` is refused when the worker is built (not found out run after run), a JSON result is
recorded as its JSON text, and docs/workers.md's example is a handler that runs."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import re
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstream.agent import Worker
from sessionstream.errors import ConfigurationError
from sessionstream.runtimes.worker._execution import Execution
from sessionstream.runtimes.worker._handler import ResultRefused, check_handler, result_text
from sessionstream.runtimes.worker._main import load_handler, run_worker
from sessionstream.runtimes.worker.context import RunContext
from sessionstream.runtimes.worker.executor import ActionRun, ActionTarget
from sessionstream.settings import Settings
from tests.unit.runtimes.worker.test_execution import SPEC, Host, event, grant, until

REPO = Path(__file__).resolve().parents[4]


# handlers as an author might write them (load_handler finds them by module:name)
def sync_run(ctx: RunContext) -> str:
    return "never called"


async def async_run(ctx: RunContext) -> str:
    return "ok"


class AsyncCallable:
    async def __call__(self, ctx: RunContext) -> str:
        return "ok"


async_callable = AsyncCallable()
not_a_function = "run"


@pytest.mark.parametrize(
    "handler",
    [sync_run, lambda ctx: async_run(ctx), AsyncCallable, not_a_function],
    ids=["def", "lambda", "class", "str"],
)
def test_the_worker_refuses_a_handler_that_is_not_async_when_it_is_built(
    handler: Any,
) -> None:
    with pytest.raises(ConfigurationError, match=r"async def run\(ctx"):
        Worker(Settings(), handler, "w-1", database_url="")


@pytest.mark.parametrize(
    "handler",
    [async_run, functools.partial(async_run), async_callable],
    ids=["async def", "partial", "async __call__"],
)
def test_the_worker_takes_any_coroutine_function(handler: Any) -> None:
    assert Worker(Settings(), handler, "w-1", database_url="").handler is handler


def test_the_cli_refuses_a_plain_def_agent_before_it_takes_any_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = f"{__name__}:sync_run"
    with pytest.raises(ConfigurationError) as refused:
        load_handler(agent)
    message = str(refused.value)
    assert agent in message and "not a coroutine function" in message, message
    assert "async def run(ctx)" in message and "asyncio.to_thread" in message, message
    assert load_handler(f"{__name__}:async_run") is async_run
    # `sessionstream worker --agent ...`: exit 2 with the reason, before any database or
    # broker is touched (none is reachable at this address)
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:9/none")
    with caplog.at_level(logging.ERROR, logger="sessionstream.worker"):
        assert run_worker(settings, agent, "w-1", None) == 2
    assert "not a coroutine function" in caplog.text


# -- the result ------------------------------------------------------------------------------
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_a_json_result_is_recorded_as_json_text_that_reads_back_as_itself(value: Any) -> None:
    text = result_text(value)
    if value is None or isinstance(value, str):
        assert text == value, "a str (or None) is sent as it is"
    else:
        assert text is not None and json.loads(text) == value


@pytest.mark.parametrize(
    "value", [{1, 2}, b"x", math.inf, {"when": object()}, [float("nan")], types.SimpleNamespace()]
)
def test_a_result_that_is_not_json_is_refused_naming_its_type(value: object) -> None:
    with pytest.raises(ResultRefused) as refused:
        result_text(value)
    assert refused.value.type_name == type(value).__name__
    assert f"of type {type(value).__name__}, which is not JSON" in str(refused.value)


def test_a_circular_result_is_refused_not_a_crash() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ResultRefused, match="Circular reference"):
        result_text(loop)


# -- docs/workers.md's example is a whole program that runs ----------------------------------
def _example() -> str:
    text = (REPO / "docs" / "workers.md").read_text()
    section = text[text.index("## Writing an agent") :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None
    return found.group(1)


class _Conn:
    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[object, ...]]] = []

    async def execute(self, sql: str, params: tuple[object, ...]) -> None:
        self.statements.append((sql, params))


class _Executor:
    """The action executor's contract, in memory: run `fn` once per key, in a
    'transaction' (the fake connection)."""

    conninfo = ""

    def __init__(self) -> None:
        self.conn = _Conn()
        self.done: dict[str, str | None] = {}

    async def raise_fence(self, run_id: str, generation: int) -> None:
        return None

    async def execute(
        self, t: ActionTarget, kind: str, key: str, fn: Any, *, transactional: bool
    ) -> tuple[bool, str | None]:
        if key not in self.done:
            run = ActionRun(key, kind, t.session_id, t.run_id, t.generation, self.conn)  # type: ignore[arg-type]
            self.done[key] = await fn(run)
        return True, self.done[key]


async def test_the_example_in_docs_workers_md_runs_and_completes_with_its_json() -> None:
    module = types.ModuleType("workers_md_example")
    exec(compile(_example(), "docs/workers.md", "exec"), module.__dict__)
    run = check_handler(module.run)
    host = Host(run)
    host.executor = _Executor()  # type: ignore[assignment]
    ex = Execution(host, SPEC)
    task = asyncio.create_task(ex.main())
    await until(lambda: "lease.acquire" in host.types())
    ex.on_event(grant(host, lease_ms=30_000))
    await until(lambda: "action.request" in host.types())
    request = next(c for c in host.sent if c.type == "action.request")
    ex.on_event(
        event(
            "action.approved",
            {"idempotency_key": "r-1:answer", "kind": "record"},
            command_id=request.command_id,
        )
    )
    await until(lambda: "run.complete" in host.types() or "run.fail" in host.types())
    assert "run.fail" not in host.types(), host.sent[-1]
    # the last command but one may be the background subtask's end: look the completion up
    complete = next(c for c in host.sent if c.type == "run.complete")
    result = json.loads(complete.payload.model_dump()["result"])
    assert sorted(result) == ["answer", "saved"], result
    assert result["saved"] == "recorded" and result["answer"], result
    assert len(host.executor.conn.statements) == 1  # type: ignore[union-attr]
    ex.on_event(event("run.finished", {"terminal_status": "completed"}))
    await asyncio.wait_for(task, 5)


def test_an_agent_is_found_in_the_directory_the_worker_starts_from(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sessionstream worker --agent mypkg.agent:run` from a project's folder: the module is
    found there without installing it (as uvicorn finds an app); a missing module or name
    is a ConfigurationError naming both."""
    pkg = tmp_path / "myproj_agents"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text("async def run(ctx):\n    return 'ok'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    handler = load_handler("myproj_agents.agent:run")
    assert handler.__name__ == "run"
    with pytest.raises(ConfigurationError, match=r"cannot import 'nope_agents.agent'.*No module"):
        load_handler("nope_agents.agent:run")
    with pytest.raises(ConfigurationError, match=r"has no 'missing'"):
        load_handler("myproj_agents.agent:missing")
