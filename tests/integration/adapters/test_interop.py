"""Producers in other languages, against a real processor, broker and registry:
the Java example of docs/producers.md (the plain Kafka client and Apache Avro, schemas from
the registry by id) and the shell example (kcat), each run as a user would run it, reading
the outcome of every command it sends from `session.outcomes`."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionstream.apps._procs import settings_env
from sessionstream.settings import Settings
from tests.integration.procs import REPO, processor
from tests.integration.worlds import isolated_world

pytestmark = pytest.mark.integration

JAVA_EXAMPLE = REPO / "docs" / "examples" / "java-outcomes"


@pytest.fixture(scope="module")
def world(settings: Settings, kafka_bootstrap: str) -> Iterator[Settings]:
    with isolated_world(settings, "interop") as s:
        p = processor(s, "interop")
        p.wait_log("assigned", 90)
        try:
            yield s
        finally:
            p.stop()


def _run(cmd: list[str], s: Settings, cwd: Path, timeout: float = 300) -> str:
    env = {**os.environ, **settings_env(s)}
    out = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


def test_the_java_example_sends_a_command_and_reads_its_outcome_and_events(
    world: Settings, tmp_path: Path
) -> None:
    """Built and run with Maven as docs/producers.md says (in a copy: nothing is built in
    the checkout). A prompt is accepted with its run and `run.started`; a second prompt to
    the busy session is rejected `session_busy` with its `command.rejected` event."""
    assert shutil.which("mvn"), "Maven is needed (make test installs it with Java)"
    work = tmp_path / "java-outcomes"
    shutil.copytree(JAVA_EXAMPLE, work, ignore=shutil.ignore_patterns("target"))
    sid = f"acme:java-{uuid.uuid4().hex[:8]}"
    first = _run(
        ["mvn", "-q", "-B", "compile", "exec:java", f"-Dexec.args={sid} 'find flights'"],
        world,
        work,
    )
    assert "outcome accepted run=" in first and "event " in first and "run.started" in first
    run = first.split("outcome accepted run=", 1)[1].split()[0]
    assert f"run={run}" in first.split("run.started", 1)[1]
    second = _run(["mvn", "-q", "-B", "exec:java", f"-Dexec.args={sid} 'book a taxi'"], world, work)
    assert "outcome rejected run=null reason=session_busy" in second, second
    assert "command.rejected" in second


def test_the_shell_example_sends_with_kcat_and_reads_the_outcome_headers(
    world: Settings, tmp_path: Path
) -> None:
    """kcat (Debian's, without Avro): the command as JSON, placed with murmur2; the
    outcome found by its key, its status read from the record's CloudEvents headers."""
    kcat = shutil.which("kcat")
    assert kcat, "kcat is needed (make test installs Debian's kcat)"
    sid = f"acme:sh-{uuid.uuid4().hex[:8]}"
    cid = str(uuid.uuid4())
    script = tmp_path / "send.sh"
    script.write_text(_shell_example())
    out = _run(["bash", str(script), sid, cid, "hello from the shell"], world, tmp_path, 120)
    assert f"{sid}/{cid}" in out, out
    assert "ce_type=sessionstream.outcome.accepted" in out, out
    assert "ce_runid=" in out and f"ce_subject={sid}" in out, out


def _shell_example() -> str:
    """The shell example exactly as docs/producers.md shows it."""
    text = (REPO / "docs" / "producers.md").read_text()
    start = text.index("```sh\n# send.sh")
    return text[start + len("```sh\n") : text.index("```", start + 6)]
