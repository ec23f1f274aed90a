"""The test trees mirror the package: every test module sits in a folder named after the
package it tests (`stack` for the whole stack, integration only), so a reader finds a
module's tests where the module is (decision 0006)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sessionstream"


def _misplaced(tree: str, extra: frozenset[str] = frozenset()) -> list[str]:
    root = REPO / "tests" / tree
    out = []
    for test in sorted(root.rglob("test_*.py")):
        folder = test.parent.relative_to(root)
        if folder == Path("."):
            continue  # the tree's own cross-cutting tests (layers, docs, public API)
        if folder.parts[0] in extra:
            continue
        if not (PACKAGE / folder).is_dir():
            out.append(str(test.relative_to(REPO)))
    return out


def test_unit_tests_sit_under_the_package_they_test() -> None:
    assert _misplaced("unit") == []


def test_integration_tests_sit_under_the_package_they_test_or_the_stack() -> None:
    assert _misplaced("integration", frozenset({"stack"})) == []
    top = [p.name for p in (REPO / "tests" / "integration").glob("test_*.py")]
    assert top == [], f"integration tests at the root, not under a package's folder: {top}"
