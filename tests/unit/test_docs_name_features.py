"""Docs and the installed code name features and versions, not the tracker's issue
numbers (a reader has the docs, not the tracker)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: "issue 16", "issues 14/17", "Issue: #16" (an external reference such as librdkafka#5456
#: or openai/codex#29627 is evidence, and stays)
ISSUE = re.compile(r"\b[Ii]ssues?:? #?\d+")


def test_no_issue_numbers_in_docs_or_packages() -> None:
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    files += (REPO / "bench").rglob("*.md")
    for pkg in ("sessionstream", "stack", "bench", "tests"):
        files += (REPO / pkg).rglob("*.py")
    files += (REPO / "stack").rglob("*.sh")
    files = [f for f in files if f != Path(__file__).resolve()]
    found = [
        f"{f.relative_to(REPO)}:{n}: {line.strip()[:80]}"
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, "\n".join(found)


def test_every_file_the_docs_name_exists() -> None:
    """A path a reader follows (`tests/...py`, `sessionstream/...py`, `stack/...sh`) is
    there: a moved or deleted file is named by its new place, not left behind."""
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "bench").rglob("*.md")]
    named = re.compile(
        r"\b(?:tests|bench|sessionstream|stack|docs)/[\w./-]+\.(?:py|md|sh|sql|json)\b"
    )
    missing = sorted(
        f"{f.relative_to(REPO)}: {path}"
        for f in files
        for path in set(named.findall(f.read_text()))
        if not (REPO / path).exists() and not re.search(r"[A-Z]{4}|NAME", path)
    )
    assert not missing, missing
