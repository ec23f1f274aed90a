"""No import cycles between our modules, type-only imports (`if TYPE_CHECKING:`) included.
The layers themselves are `lint-imports`' contracts (pyproject.toml, run by `make lint`)."""

from __future__ import annotations

import grimp

PACKAGES = ("sessionstream",)


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported.split(".")[0] not in PACKAGES or imported == importer:
                continue
            # a package importing its own submodules (and back) is how __init__ works
            if imported.startswith(importer + ".") or importer.startswith(imported + "."):
                continue
            if graph.chain_exists(importer=imported, imported=importer):
                chain = graph.find_shortest_chain(importer=imported, imported=importer)
                cycles.append(f"{importer} -> {imported} -> ... -> {importer}: {chain}")
    assert not cycles, "\n".join(cycles)


def test_the_install_adds_one_top_level_name() -> None:
    """A user's environment gets `sessionstream` and nothing else (generic names such as
    `schemas` or `streams` belong to other distributions), and every folder of Python code
    under it is a package the wheel ships (a folder without `__init__.py` would be left out)."""
    import tomllib
    from pathlib import Path

    import setuptools

    repo = Path(__file__).resolve().parents[2]
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = setuptools.find_packages(where=repo, include=include)
    assert {name.split(".")[0] for name in shipped} == {"sessionstream"}
    code_dirs = {
        ".".join(p.parent.relative_to(repo).parts)
        for p in (repo / "sessionstream").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert code_dirs <= set(shipped), sorted(code_dirs - set(shipped))


def test_no_module_is_over_600_lines_but_the_decider() -> None:
    """A module a newcomer opens reads in one sitting (the decider too: one module per
    family of rules)."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "sessionstream"
    long = {
        str(p.relative_to(package)): n
        for p in package.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, long
