"""The Kafka Connect sink's configuration, from the settings (docs/analytics.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from sessionstream.adapters.connect import connector_config, registry_v2_url
from sessionstream.errors import ConfigurationError
from sessionstream.settings import Settings

SHIPPED = Path(__file__).resolve().parents[3] / "stack" / "connect" / "analytics-events.json"


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults, whatever the shell running the tests sets."""
    import os

    for name in list(os.environ):
        if name.startswith("SESSIONSTREAM_"):
            monkeypatch.delenv(name)


def _defaults() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def test_the_shipped_config_is_the_one_the_defaults_make() -> None:
    assert json.loads(SHIPPED.read_text()) == connector_config(_defaults())


def test_the_database_url_becomes_a_jdbc_url_and_the_password_setting_wins() -> None:
    s = _defaults().model_copy(
        update={
            "database_url": "postgresql://ana:inurl@db.internal:6543/warehouse?sslmode=require",
            "database_password": SecretStr("fromsetting"),
        }
    )
    c = connector_config(s)
    assert c["connection.url"] == "jdbc:postgresql://db.internal:6543/warehouse?sslmode=require"
    assert (c["connection.username"], c["connection.password"]) == ("ana", "fromsetting")


def test_the_converter_reads_confluent_framing_by_content_id_from_apicurio() -> None:
    c = connector_config(_defaults())
    assert c["value.converter.apicurio.registry.url"] == "http://127.0.0.1:8081/apis/registry/v2"
    assert c["value.converter.apicurio.registry.as-confluent"] == "true"
    assert c["value.converter.apicurio.registry.use-id"] == "contentId"
    assert c["consumer.override.isolation.level"] == "read_committed"
    assert c["errors.tolerance"] == "none"  # a record it cannot read stops it, never skipped
    assert c["insert.mode"] == "upsert" and c["primary.key.fields"] == "session_id,run_id,seq"


def test_registry_credentials_reach_the_converter() -> None:
    s = _defaults().model_copy(
        update={"schema_registry_username": "reg", "schema_registry_password": SecretStr("pw")}
    )
    c = connector_config(s)
    assert c["value.converter.apicurio.auth.username"] == "reg"
    assert c["value.converter.apicurio.auth.password"] == "pw"


@pytest.mark.parametrize(
    "url", ["http://registry:8081", "http://registry:8081/apis/registry/v3", ""]
)
def test_a_registry_that_is_not_apicurio_is_refused_with_the_setting_named(url: str) -> None:
    s = _defaults().model_copy(update={"schema_registry_url": url})
    with pytest.raises(ConfigurationError, match="SESSIONSTREAM_SCHEMA_REGISTRY_URL"):
        registry_v2_url(s)


@pytest.mark.parametrize("table", ["run_events", "a.b.c", "analytics.x;drop", "analytics.", ""])
def test_a_table_name_must_be_schema_dot_table(table: str) -> None:
    with pytest.raises(ConfigurationError, match=r"schema\.table"):
        connector_config(_defaults(), table=table)


def test_start_is_earliest_or_latest() -> None:
    assert (
        connector_config(_defaults(), start="latest")["consumer.override.auto.offset.reset"]
        == "latest"
    )
    with pytest.raises(ConfigurationError):
        connector_config(_defaults(), start="yesterday")


def test_every_array_field_of_a_payload_is_left_out_of_the_rows() -> None:
    """The JDBC sink fails a task on an array column ("No default value resolution for
    schema type ARRAY"): every list a payload carries is excluded, new ones included."""
    excluded = connector_config(_defaults())["transforms.lists.exclude"].split(",")
    assert "payload_RunStarted_approvalKinds" in excluded
    assert "payload_RunQueued_approvalKinds" in excluded
    assert "payload_CancelAcknowledged_toolsAborted" in excluded
    assert not [c for c in excluded if c.endswith(("_prompt", "_input", "_result"))]
