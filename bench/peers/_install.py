"""Installs the peer systems once, cached outside the repo (`~/.cache/sessionstream/peers`,
or `$SESSIONSTREAM_PEERS_CACHE`); a second call finds them and returns at once.

* Restate: `npm install @restatedev/restate-server@VERSION` (the Linux binary ships in the
  package `@restatedev/restate-server-linux-x64`).
* Temporal: `go install github.com/temporalio/cli/cmd/temporal@VERSION` through the Go module
  proxy (~200 s on 2 cores the first time); its `server start-dev` is the dev server.
* Python: `restate-sdk`, `hypercorn` and `temporalio` into this interpreter's environment
  when they are missing (the `peers` extra of pyproject.toml).

How long each install took is kept in `installs.json` beside them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESTATE_VERSION = "1.7.12"
#: v1.9.x's go.mod has a `replace` directive and cannot be `go install`ed
TEMPORAL_CLI_VERSION = "v1.5.1"
PYTHON_PACKAGES = {
    "restate": "restate-sdk==1.2.0",
    "hypercorn": "hypercorn>=0.17",
    "temporalio": "temporalio>=1.20",
}

CACHE = Path(
    os.environ.get("SESSIONSTREAM_PEERS_CACHE", Path.home() / ".cache" / "sessionstream" / "peers")
)


def _record(what: str, seconds: float) -> None:
    path = CACHE / "installs.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[what] = {"seconds": round(seconds, 1), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path.write_text(json.dumps(data, indent=2) + "\n")


def install_times() -> dict[str, object]:
    path = CACHE / "installs.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _run(
    what: str, cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> None:
    print(f"peers: installing {what}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    log = CACHE / f"install-{what}.log"
    with log.open("wb") as out:
        code = subprocess.call(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"installing {what} failed ({code}); see {log}")
    _record(what, time.perf_counter() - t0)


def restate_server() -> Path:
    """The restate-server binary."""
    root = CACHE / f"restate-{RESTATE_VERSION}"
    exe = root / "node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
    if not exe.exists():
        root.mkdir(parents=True, exist_ok=True)
        _run(
            "restate",
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(root),
                f"@restatedev/restate-server@{RESTATE_VERSION}",
            ],
            cwd=root,
        )
    return exe


def temporal_cli() -> Path:
    """The temporal CLI binary (its dev server: `temporal server start-dev`)."""
    bin_dir = CACHE / f"temporal-{TEMPORAL_CLI_VERSION}" / "bin"
    exe = bin_dir / "temporal"
    if not exe.exists():
        bin_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GOBIN=str(bin_dir), GOFLAGS="-mod=mod")
        _run(
            "temporal",
            ["go", "install", f"github.com/temporalio/cli/cmd/temporal@{TEMPORAL_CLI_VERSION}"],
            env=env,
            cwd=CACHE,
        )
    return exe


def python_packages(modules: list[str]) -> None:
    """pip-install the packages of the `modules` this interpreter cannot import."""
    missing = [PYTHON_PACKAGES[m] for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        CACHE.mkdir(parents=True, exist_ok=True)
        _run(
            "python-" + "-".join(sorted(m.split("=")[0].split(">")[0] for m in missing)),
            [sys.executable, "-m", "pip", "install", "-q", *missing],
        )
