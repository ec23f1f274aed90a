"""No import cycles between our modules, type-only imports (`if TYPE_CHECKING:`) included.
The layers themselves are `lint-imports`' contracts (pyproject.toml, run by `make lint`)."""

from __future__ import annotations

import grimp

PACKAGES = ("sessionstream", "schemas", "streams", "sinks", "consumers")


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
