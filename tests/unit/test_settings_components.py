"""Settings per component: each long-running process builds only the components it reads,
and reads no field of another (derived here from the code each process runs, so a process
can never run on a default it was meant to be told)."""

from __future__ import annotations

import re
from pathlib import Path

import grimp
import pytest
from pydantic import SecretStr

from sessionstream.errors import ConfigurationError
from sessionstream.settings import (
    COMPONENTS,
    PROCESS_COMPONENTS,
    Settings,
    get_settings,
    settings_for,
)

#: the packages each process runs (its CLI command adds only the metrics port)
ROOTS = {
    "processor": "sessionstream.runtimes.processor",
    "sink": "sessionstream.runtimes.sink",
    "worker": "sessionstream.runtimes.worker",
    "gateway": "sessionstream.apps.gateway",
    "analytics": "sessionstream.runtimes.analytics",
    "webhooks": "sessionstream.runtimes.webhooks",
}
#: properties of the settings, and the components whose fields they read
PROPERTIES = {
    "store_path": {"processor"},
    "database_conninfo": {"database"},
    "analytics_url": {"gateway", "analytics"},
}


def _owner() -> dict[str, str]:
    owner = {}
    for name, part in COMPONENTS.items():
        for field in part.model_fields:
            if field != "credentials_file":  # every component's (where its secrets are)
                owner[field] = name
    return owner


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("sessionstream")


def _source(module: str) -> str:
    spec = __import__("importlib").util.find_spec(module)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_text()


@pytest.mark.parametrize("process", sorted(ROOTS))
def test_a_process_reads_only_the_components_it_builds(
    process: str, graph: grimp.ImportGraph
) -> None:
    root = ROOTS[process]
    modules = {m for m in graph.modules if m == root or m.startswith(root + ".")}
    for m in list(modules):
        modules |= graph.find_upstream_modules(m)
    modules = {m for m in modules if not m.startswith("sessionstream.settings")}
    # the pure core and the wire contract cannot import the settings (the layer contracts):
    # a word there that looks like a field (a decider's `max_payload_bytes`) is not a read
    modules = {
        m for m in modules if not m.startswith(("sessionstream.core", "sessionstream.schemas"))
    }
    owner = _owner()
    read: dict[str, set[str]] = {}
    for module in sorted(modules):
        words = set(re.findall(r"\b[a-z_]+\b", _source(module)))
        for field in words & owner.keys():
            read.setdefault(owner[field], set()).add(f"{module}: {field}")
        for prop in words & PROPERTIES.keys():
            for component in PROPERTIES[prop]:
                read.setdefault(component, set()).add(f"{module}: {prop}")
        assert "get_settings(" not in _source(module) or module == "sessionstream.client", (
            f"{module} builds every component (get_settings) inside the {process}"
        )
    outside = {c: sorted(w) for c, w in read.items() if c not in PROCESS_COMPONENTS[process]}
    assert not outside, f"the {process} reads settings it does not build: {outside}"
    # and builds nothing it does not read (the metrics port is read by its CLI command)
    unread = set(PROCESS_COMPONENTS[process]) - set(read) - {"metrics"}
    assert not unread, f"the {process} builds components it never reads: {sorted(unread)}"


def test_every_field_is_in_exactly_one_component() -> None:
    seen: dict[str, str] = {}
    for name, part in COMPONENTS.items():
        for field in part.model_fields:
            if field == "credentials_file":
                continue
            assert field not in seen, (field, seen.get(field), name)
            seen[field] = name
    assert set(seen) | {"credentials_file"} == set(Settings.model_fields)


def test_a_value_for_another_component_neither_stops_a_process_nor_reaches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings_for.cache_clear()
    monkeypatch.setenv("SESSIONSTREAM_GATEWAY_PORT", "not a port")
    monkeypatch.setenv("SESSIONSTREAM_MODEL_NAME", "gpt-x")
    monkeypatch.setenv("SESSIONSTREAM_PROCESSOR_BATCH_SIZE", "77")
    monkeypatch.setenv("SESSIONSTREAM_EVENTS_TOPIC", "t.events")
    try:
        s = settings_for("processor")
        assert (s.processor_batch_size, s.events_topic) == (77, "t.events")
        assert (s.gateway_port, s.model_name) == (8080, "sessionstream-echo")  # defaults
        assert settings_for("worker").model_name == "gpt-x"
        refused = r"(?s)gateway: invalid gateway settings.*gateway_port"
        with pytest.raises(ConfigurationError, match=refused):
            settings_for("gateway")
        with pytest.raises(ValueError, match="gateway_port"):
            get_settings.__wrapped__()  # every component: the tools refuse it
    finally:
        settings_for.cache_clear()


def test_a_process_reads_its_secrets_from_the_credentials_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "sink.env"
    creds.write_text(
        "SESSIONSTREAM_DATABASE_PASSWORD=pw-from-file\nSESSIONSTREAM_KAFKA_USERNAME=u\n"
    )
    monkeypatch.setenv("SESSIONSTREAM_CREDENTIALS_FILE", str(creds))
    settings_for.cache_clear()
    try:
        s = settings_for("sink")
        assert s.database_password == SecretStr("pw-from-file")
        assert s.kafka_username == "u"
        assert "pw-from-file" in s.database_conninfo
        assert "pw-from-file" not in repr(s)
    finally:
        settings_for.cache_clear()
