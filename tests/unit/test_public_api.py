"""Producers and agent authors import from `sessionstream` only: the SDK's names are there
and are the runtime's own objects, the docs' code imports nothing else of ours, and every
public module's `__all__` holds what it says."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import textwrap
import tomllib
from pathlib import Path

import pytest

import sessionstream
import sessionstream.agent
import sessionstream.runtimes.worker


def test_the_agent_sdk_is_under_sessionstream() -> None:
    assert sorted(sessionstream.agent.__all__) == sorted(sessionstream.runtimes.worker.__all__)
    for name in sessionstream.runtimes.worker.__all__:
        assert getattr(sessionstream.agent, name) is getattr(sessionstream.runtimes.worker, name)


def test_the_producer_sdk_is_under_sessionstream() -> None:
    from sessionstream.client import CommandHandle, Outcome, SessionClient

    assert SessionClient.wait and CommandHandle and Outcome


# -- the docs import only from `sessionstream`, and what they import is there -------------------
REPO = Path(__file__).resolve().parents[2]
#: the packages this distribution installs; of them, users import `sessionstream` only
PACKAGES = frozenset(
    tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
)
#: what a producer or an agent author imports: each a documented module with `__all__`
PUBLIC = (
    "sessionstream",
    "sessionstream.agent",
    "sessionstream.client",
    "sessionstream.commands",
    "sessionstream.events",
    "sessionstream.errors",
    "sessionstream.settings",
)
_BLOCK = re.compile(r"^[ \t]*```python\n(.*?)^[ \t]*```", re.S | re.M)
#: a dotted name in inline code: `sessionstream.agent.Model`
_MENTION = re.compile(r"`(sessionstream(?:\.[A-Za-z_]\w*)+)")


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _doc_imports() -> list[tuple[str, str, str | None]]:
    """(where, module, name) of every import in the docs' python blocks; name None for a
    plain `import module`."""
    found: list[tuple[str, str, str | None]] = []
    for doc in _docs():
        text = doc.read_text()
        for block in _BLOCK.finditer(text):
            line = text.count("\n", 0, block.start(1)) + 1
            tree = compile(
                textwrap.dedent(block.group(1)),
                str(doc),
                "exec",
                flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            )
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    where = f"{doc.relative_to(REPO)}:{line + node.lineno - 1}"
                    found += [(where, a.name, None) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    where = f"{doc.relative_to(REPO)}:{line + node.lineno - 1}"
                    found += [(where, node.module, a.name) for a in node.names]
    return found


def test_the_docs_code_imports_the_project_only_from_sessionstream() -> None:
    imports = _doc_imports()
    wrong = {
        f"{where}: {module}": None
        for where, module, _ in imports
        if module.split(".")[0] in PACKAGES - {"sessionstream"}
        or any(part.startswith("_") for part in module.split(".")[1:])
    }
    assert not wrong, "docs import from outside the public root:\n" + "\n".join(wrong)
    ours = {module for _, module, _ in imports if module.split(".")[0] == "sessionstream"}
    assert {"sessionstream.agent", "sessionstream.client"} <= ours, "the docs' examples moved?"


def test_every_name_the_docs_import_from_sessionstream_is_public_there() -> None:
    missing = []
    for where, module, name in _doc_imports():
        if module.split(".")[0] != "sessionstream":
            continue
        mod = importlib.import_module(module)
        if name is not None and name not in getattr(mod, "__all__", ()):
            missing.append(f"{where}: {name} is not in {module}.__all__")
    assert not missing, "\n".join(missing)


def test_the_names_the_docs_mention_under_a_sessionstream_module_exist() -> None:
    """`sessionstream.client.SessionClient` in prose resolves. (Dotted names that are no
    module of ours — Avro namespaces such as `sessionstream.event`, headers — are not code.)"""
    unknown = []
    for doc in _docs():
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for dotted in _MENTION.findall(line):
                parts = dotted.split(".")
                if importlib.util.find_spec(".".join(parts[:2])) is None:
                    continue
                obj: object = importlib.import_module(".".join(parts[:2]))
                for i, attr in enumerate(parts[2:], 3):
                    if not hasattr(obj, attr):
                        # a submodule is an attribute of its package only once imported:
                        # import it by name, so the answer does not hang on test order
                        try:
                            obj = importlib.import_module(".".join(parts[:i]))
                            continue
                        except ImportError:
                            unknown.append(f"{doc.relative_to(REPO)}:{n}: {dotted}")
                            break
                    obj = getattr(obj, attr)
    assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize("name", PUBLIC)
def test_a_public_module_is_documented_and_its_names_resolve(name: str) -> None:
    module = importlib.import_module(name)
    assert (module.__doc__ or "").strip(), f"{name} has no docstring"
    assert isinstance(module.__all__, list | tuple), f"{name} has no __all__"
    assert [n for n in module.__all__ if not hasattr(module, n)] == []


def test_every_public_module_under_sessionstream_resolves_its_all() -> None:
    """Any module without a leading `_` is importable as written; its `__all__` holds no
    name it lacks."""
    bad = []
    for info in pkgutil.walk_packages(sessionstream.__path__, "sessionstream."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        module = importlib.import_module(info.name)
        bad += [
            f"{info.name}.{n}" for n in getattr(module, "__all__", ()) if not hasattr(module, n)
        ]
    assert bad == []


def test_the_producer_types_are_the_wire_contracts_own() -> None:
    """`sessionstream.commands` / `.events` re-export `schemas`' models: one class each."""
    import sessionstream.commands
    import sessionstream.events
    import sessionstream.schemas.commands
    import sessionstream.schemas.events

    for public, contract in (
        (sessionstream.commands, sessionstream.schemas.commands),
        (sessionstream.events, sessionstream.schemas.events),
    ):
        for n in public.__all__:
            assert getattr(public, n) is getattr(contract, n), f"{public.__name__}.{n}"
