"""The README's Python example runs as a user runs it: a program of its own, configured by
`SESSIONSTREAM_*` variables, against a real processor. (docs/workers.md's example runs in
tests/unit/runtimes/worker/test_handler_contract.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sessionstream.apps._procs import settings_env
from sessionstream.settings import Settings
from tests.integration.procs import Proc, processor

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def test_the_readme_producer_example_gets_its_outcome(
    iso: Settings, procs: list[Proc], tmp_path: Path
) -> None:
    found = re.search(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
    assert found, "README.md has no python example"
    procs.append(processor(iso))
    done = subprocess.run(
        [sys.executable, "-c", found.group(1)],
        env=settings_env(iso),
        cwd=tmp_path,  # not the repository: sessionstream as installed
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    status, run_id, reason = done.stdout.split()
    assert (status, reason) == ("accepted", "None") and run_id, done.stdout
