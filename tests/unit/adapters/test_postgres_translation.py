"""psycopg's errors are translated once, at the PostgreSQL adapter: no database to talk to
is `DatabaseUnavailable`, every other driver error `QueryFailed` with its sqlstate, both a
`DatabaseError`. Above the adapter nothing catches a psycopg exception: the source of every
module outside `sessionstream/adapters/` is read, and an `except` or `contextlib.suppress`
naming one fails the test. The driver errors here are made by hand: no database needed."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from sessionstream.adapters.postgres import failure, translated
from sessionstream.errors import (
    DatabaseError,
    DatabaseUnavailable,
    QueryFailed,
    SessionstreamError,
)

CONNINFO = "postgresql://someone:s3cret-pw@db.example:5433/things"

UNAVAILABLE = [
    psycopg.OperationalError("connection failed: Connection refused"),
    PoolTimeout("couldn't get a connection after 10.00 sec"),
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    psycopg.errors.ConnectionFailure("server closed the connection unexpectedly"),
]
REFUSED = [
    (psycopg.errors.UniqueViolation("duplicate key value violates unique constraint"), "23505"),
    (psycopg.errors.UndefinedTable('relation "nope" does not exist'), "42P01"),
    # operational, but the statement's failure: a timeout or cancel, a deadlock
    (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), "57014"),
    (psycopg.errors.DeadlockDetected("deadlock detected"), "40P01"),
    # refused by the driver before the server saw it
    (psycopg.ProgrammingError("the query has 1 placeholder but 2 parameters were passed"), None),
]


@pytest.mark.parametrize("error", UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_no_database_to_talk_to_is_database_unavailable(error: psycopg.Error) -> None:
    with pytest.raises(DatabaseUnavailable) as got, translated(CONNINFO, queries=True):
        raise error
    assert got.value.__cause__ is error
    assert got.value.url == "someone@db.example:5433/things"
    assert "s3cret-pw" not in str(got.value)
    assert got.value.reason == str(error).strip() and got.value.reason in str(got.value)
    assert isinstance(failure(error, CONNINFO), DatabaseUnavailable)


@pytest.mark.parametrize(("error", "sqlstate"), REFUSED, ids=lambda e: type(e).__name__)
def test_every_other_driver_error_is_query_failed_with_its_sqlstate(
    error: psycopg.Error, sqlstate: str | None
) -> None:
    with pytest.raises(QueryFailed) as got, translated(CONNINFO, queries=True):
        raise error
    assert got.value.__cause__ is error
    assert got.value.sqlstate == sqlstate
    assert str(got.value) == f"query failed ({sqlstate}): {error}"
    assert got.value.reason == str(error)


def test_both_are_one_database_error_under_the_one_root() -> None:
    assert issubclass(DatabaseUnavailable, DatabaseError)
    assert issubclass(QueryFailed, DatabaseError)
    assert issubclass(DatabaseError, SessionstreamError)


def test_the_translation_works_around_an_await() -> None:
    async def statement() -> None:
        await asyncio.sleep(0)
        raise psycopg.errors.UndefinedColumn('column "x" does not exist')

    async def run() -> None:
        with translated(CONNINFO, queries=True):
            await statement()

    with pytest.raises(QueryFailed) as got:
        asyncio.run(run())
    assert got.value.sqlstate == "42703"


def test_other_errors_pass_unchanged() -> None:
    with pytest.raises(KeyError), translated(CONNINFO, queries=True):
        raise KeyError("not the driver's")


def test_without_queries_only_connection_errors_are_translated() -> None:
    """`connect`, `migrate` and the gateway's pool: SQL errors go up as they are, and any
    OperationalError (whatever the server said) is `DatabaseUnavailable`, as before."""
    with pytest.raises(psycopg.errors.UniqueViolation), translated(CONNINFO):
        raise psycopg.errors.UniqueViolation("duplicate key")
    with pytest.raises(DatabaseUnavailable), translated(CONNINFO):
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    with pytest.raises(DatabaseUnavailable), translated(CONNINFO):
        raise PoolTimeout("couldn't get a connection")


# -- nothing above the adapter catches a driver exception ----------------------------------------
PACKAGE = Path(__file__).resolve().parents[3] / "sessionstream"
DRIVERS = frozenset({"psycopg", "psycopg_pool"})
#: (module, the caught name): the settings parse a connection string with psycopg's parser,
#: which refuses a malformed one with ProgrammingError; no database is involved, and the
#: settings sit below the adapters (`lint-imports`), so they cannot use the translation
ALLOWED = frozenset({("sessionstream/settings/_base.py", "ProgrammingError")})


def _driver_names(tree: ast.AST) -> set[str]:
    """The names a module binds to the drivers or to something imported from them."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in DRIVERS:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] in DRIVERS
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _flat(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Tuple):
        return [leaf for element in node.elts for leaf in _flat(element)]
    return [node]


def _caught(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every exception an `except` or a `suppress(...)` names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            exprs = _flat(node.type)
        elif isinstance(node, ast.Call) and _dotted(node.func) in (
            "contextlib.suppress",
            "suppress",
        ):
            exprs = [leaf for arg in node.args for leaf in _flat(arg)]
        else:
            continue
        found += [(node.lineno, d) for e in exprs if (d := _dotted(e)) is not None]
    return found


def driver_catches(source: str) -> list[tuple[int, str]]:
    """(line, name) of each driver exception `source` catches."""
    tree = ast.parse(source)
    drivers = _driver_names(tree)
    return [(line, name) for line, name in _caught(tree) if name.split(".")[0] in drivers]


def test_the_scan_sees_every_way_of_naming_a_driver_exception() -> None:
    source = """
import contextlib
from contextlib import suppress
import psycopg
import psycopg_pool as pp
from psycopg import OperationalError as Lost
from psycopg.errors import UniqueViolation
try:
    pass
except psycopg.Error:
    pass
except (KeyError, (psycopg.errors.QueryCanceled, Lost)):
    pass
except pp.PoolTimeout:
    pass
except KeyError:
    pass
try:
    pass
except* UniqueViolation:
    pass
with contextlib.suppress(OSError, psycopg.Error), suppress(Lost):
    pass
"""
    assert sorted(driver_catches(source)) == [
        (10, "psycopg.Error"),
        (12, "Lost"),
        (12, "psycopg.errors.QueryCanceled"),
        (14, "pp.PoolTimeout"),
        (20, "UniqueViolation"),
        (22, "Lost"),
        (22, "psycopg.Error"),
    ]


def test_no_module_above_the_adapters_catches_a_driver_exception() -> None:
    modules = [
        p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] != "adapters"
    ]
    assert len(modules) > 50, f"found {len(modules)} modules under {PACKAGE}"
    found, allowed = [], set()
    for path in modules:
        where = path.relative_to(PACKAGE.parent).as_posix()
        for line, name in sorted(driver_catches(path.read_text())):
            if (where, name) in ALLOWED:
                allowed.add((where, name))
            else:
                found.append(f"{where}:{line}: {name}")
    assert not found, (
        "driver exceptions caught above the adapter (translate them with "
        "`sessionstream.adapters.postgres.translated(..., queries=True)` and catch "
        "`DatabaseError` / `DatabaseUnavailable` / `QueryFailed`):\n" + "\n".join(found)
    )
    assert allowed == ALLOWED, f"stale exceptions to the rule: {ALLOWED - allowed}"
