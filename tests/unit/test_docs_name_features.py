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
