"""The action executor's fencing token against the real PostgreSQL: a generation that a
newer one has fenced never commits an action, whatever it believes about its lease."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.runtimes.worker._signal import RunFenced
from sessionstream.runtimes.worker.executor import ActionExecutor, ActionRun, ActionTarget

pytestmark = pytest.mark.integration


@pytest.fixture
async def executor(database_url: str) -> AsyncIterator[tuple[ActionExecutor, str]]:
    schema = f"it_fence_{uuid.uuid4().hex[:8]}"
    migrate(database_url, schema=schema)
    ex = ActionExecutor(database_url, schema)
    await ex.open()
    yield ex, schema
    await ex.close()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'drop schema if exists "{schema}" cascade')


async def _write(a: ActionRun) -> str:
    assert a.conn is not None
    await a.conn.execute(
        "insert into agent_outbox (idempotency_key, session_id, run_id, recipient, subject, body)"
        " values (%s, %s, %s, 'ops@example.com', 's', 'b')",
        (a.idempotency_key, a.session_id, a.run_id),
    )
    return "sent"


def _rows(database_url: str, schema: str, run_id: str) -> tuple[int, int]:
    with psycopg.connect(database_url, options=f"-c search_path={schema}") as conn:
        acts = conn.execute("select count(*) from agent_actions where run_id = %s", (run_id,))
        mails = conn.execute("select count(*) from agent_outbox where run_id = %s", (run_id,))
        return int(acts.fetchone()[0]), int(mails.fetchone()[0])  # type: ignore[index]


@pytest.mark.parametrize("transactional", [True, False])
async def test_an_older_generation_is_refused_where_the_effect_happens(
    executor: tuple[ActionExecutor, str], database_url: str, transactional: bool
) -> None:
    ex, schema = executor
    run = f"r-{uuid.uuid4().hex[:8]}"
    old = ActionTarget("s-1", run, 1, "w-old")
    new = ActionTarget("s-1", run, 2, "w-new")
    # the new holder was granted generation 2 and raised the fence; the old one, frozen
    # through its lease, now wakes up with an approval it got before
    await ex.raise_fence(run, 2)
    effect = _write if transactional else _external
    with pytest.raises(RunFenced, match="generation 2 holds"):
        await ex.execute(old, "email", f"{run}:email", effect, transactional=transactional)
    assert _rows(database_url, schema, run) == (0, 0), "nothing of the fenced action is written"
    # the current generation acts once; the fence never moves back
    ok, result = await ex.execute(new, "email", f"{run}:email", _write, transactional=True)
    assert (ok, result) == (True, "sent")
    with pytest.raises(RunFenced):  # an old holder raising it learns it is fenced
        await ex.raise_fence(run, 1)
    with pytest.raises(RunFenced):
        await ex.execute(old, "email", f"{run}:email-2", _write, transactional=True)
    assert _rows(database_url, schema, run) == (1, 1)


async def test_an_action_raises_the_fence_itself(
    executor: tuple[ActionExecutor, str], database_url: str
) -> None:
    """If a new holder could not raise the fence at its grant (database away), its first
    action does, and from then on the older generation is refused."""
    ex, schema = executor
    run = f"r-{uuid.uuid4().hex[:8]}"
    await ex.execute(
        ActionTarget("s", run, 3, "w3"), "email", f"{run}:a", _write, transactional=True
    )
    with pytest.raises(RunFenced):
        await ex.execute(
            ActionTarget("s", run, 2, "w2"), "email", f"{run}:b", _write, transactional=True
        )
    assert _rows(database_url, schema, run) == (1, 1)


async def _external(a: ActionRun) -> str:
    raise AssertionError("a fenced external action must not run its effect")
