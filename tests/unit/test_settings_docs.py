"""The settings a user reads about are the settings there are: the README's table is made
from the fields, every `SESSIONSTREAM_*` a doc names exists, and an unknown one is named
at start instead of ignored in silence."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sessionstream.settings import (
    TOOLING_VARIABLES,
    setting_variables,
    settings_table,
    unknown_variables,
)

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- settings:begin -->\n(.*?)\n<!-- settings:end -->", re.S)


def test_the_readme_table_is_the_one_the_fields_make() -> None:
    found = BLOCK.search((REPO / "README.md").read_text())
    assert found, "README.md lost its settings markers"
    assert found.group(1) == settings_table(), (
        "README's settings table is stale: run `sessionstream settings --markdown` and paste it"
    )


def _named_in_docs() -> dict[str, set[str]]:
    files = [
        REPO / "README.md",
        REPO / "docker-compose.yml",
        REPO / "Dockerfile",
        *sorted((REPO / "docs").rglob("*.md")),
        *sorted((REPO / "stack").rglob("*.sh")),
    ]
    named: dict[str, set[str]] = {}
    for f in files:
        for name in re.findall(r"SESSIONSTREAM_[A-Z0-9_]*[A-Z0-9]", f.read_text()):
            named.setdefault(name, set()).add(str(f.relative_to(REPO)))
    return named


def test_every_variable_the_docs_name_exists() -> None:
    known = setting_variables() | TOOLING_VARIABLES | {"SESSIONSTREAM_X"}
    # a prefix written as `SESSIONSTREAM_GATEWAY_SSE_*` or `SESSIONSTREAM_SECURE_...`
    unknown = {
        n: sorted(where)
        for n, where in _named_in_docs().items()
        if n not in known and not any(k.startswith(n + "_") for k in known)
    }
    assert not unknown, f"docs name variables nothing reads: {unknown}"


def test_every_setting_is_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    assert all(v in readme for v in setting_variables())


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("SESSIONSTREAM_KAFKA_BOOTSRAP", "SESSIONSTREAM_KAFKA_BOOTSTRAP"),
        ("SESSIONSTREAM_WORKER_GROUP", None),
        ("SESSIONSTREAM_PROCESOR_GROUP", "SESSIONSTREAM_PROCESSOR_GROUP"),
    ],
)
def test_an_unknown_variable_is_named_with_the_closest_setting(name: str, hint: str | None) -> None:
    (line,) = unknown_variables({name: "x", "PATH": "/bin"})
    assert line.startswith(f"{name} is not a sessionstream setting and is ignored")
    if hint:
        assert f"did you mean {hint}?" in line


def test_settings_and_tool_variables_are_not_warned_about() -> None:
    env = {v: "x" for v in setting_variables() | TOOLING_VARIABLES}
    assert unknown_variables(env) == []


def test_a_process_warns_at_start() -> None:
    r = subprocess.run(
        [str(Path(sys.executable).parent / "sessionstream"), "version"],
        env={"SESSIONSTREAM_KAFKA_BOOTSRAP": "elsewhere:9092", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "warning: SESSIONSTREAM_KAFKA_BOOTSRAP is not a sessionstream setting" in r.stderr
