"""Kafka and PostgreSQL credentials in the settings: where they come from, where they go,
and that a password never shows in a repr, an error or a child's settings by accident."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sessionstream.adapters.kafka import aiokafka_config, client_config, faust_credentials
from sessionstream.apps._procs import settings_env
from sessionstream.settings import Settings, redact_conninfo

SECRET = "s3cr3t-Pa55"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("SESSIONSTREAM_"):
            monkeypatch.delenv(key)


def _file(tmp_path: Path, **values: str) -> Path:
    path = tmp_path / "role.env"
    lines = ["# a comment", "NOT_OURS=1"]
    lines += [f"SESSIONSTREAM_{k.upper()}={v}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plaintext_by_default_and_no_security_keys() -> None:
    s = Settings()
    assert s.kafka_security_protocol == "PLAINTEXT"
    conf = client_config(s)
    assert not any(k.startswith(("security.", "sasl.")) for k in conf)
    assert aiokafka_config(s) == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }
    assert faust_credentials(s) is None


def test_credentials_file_below_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(
        tmp_path,
        kafka_bootstrap="127.0.0.1:9192",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_username="sink",
        kafka_password=SECRET,
        database_url="postgresql://ss_sink@127.0.0.1:5432/sessionstream_secure",
        database_password=SECRET,
    )
    monkeypatch.setenv("SESSIONSTREAM_CREDENTIALS_FILE", str(path))
    s = Settings()
    assert (s.kafka_username, s.kafka_bootstrap) == ("sink", "127.0.0.1:9192")
    monkeypatch.setenv("SESSIONSTREAM_KAFKA_USERNAME", "other")
    assert Settings().kafka_username == "other"  # an explicit variable wins
    assert Settings(kafka_username="arg").kafka_username == "arg"  # and an argument more


def test_missing_credentials_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Settings(credentials_file=tmp_path / "nope.env")


def test_sasl_config_for_every_client(tmp_path: Path) -> None:
    s = Settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_username="producer",
        kafka_password=SECRET,
    )
    conf = client_config(s, **{"group.id": "g"})
    assert conf["security.protocol"] == "sasl_plaintext"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (conf["sasl.username"], conf["sasl.password"]) == ("producer", SECRET)
    assert conf["group.id"] == "g"
    aio = aiokafka_config(s)
    assert aio["security_protocol"] == "SASL_PLAINTEXT"
    assert (aio["sasl_plain_username"], aio["sasl_plain_password"]) == ("producer", SECRET)
    assert aio["sasl_mechanism"] == "SCRAM-SHA-512"
    creds = faust_credentials(s)
    assert (creds.username, creds.password, creds.mechanism.value) == (
        "producer",
        SECRET,
        "SCRAM-SHA-512",
    )
    assert SECRET not in repr(creds)


def test_sasl_without_credentials_is_refused_without_echoing_input() -> None:
    with pytest.raises(ValidationError) as info:
        Settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_password=SECRET)
    assert "needs kafka_username and kafka_password" in str(info.value)
    assert SECRET not in str(info.value)


def test_passwords_are_masked_but_reach_child_processes(tmp_path: Path) -> None:
    s = Settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_username="processor",
        kafka_password=SECRET,
        database_password=SECRET,
    )
    assert SECRET not in repr(s) and SECRET not in str(s)
    env = settings_env(s)
    assert env["SESSIONSTREAM_KAFKA_PASSWORD"] == SECRET
    assert env["SESSIONSTREAM_DATABASE_PASSWORD"] == SECRET


def test_database_password_joins_the_url_for_psycopg_only() -> None:
    s = Settings(
        database_url="postgresql://ss_sink@127.0.0.1:5432/sessionstream_secure",
        database_password=SECRET,
    )
    assert SECRET in s.database_conninfo and "user=ss_sink" in s.database_conninfo
    assert redact_conninfo(s.database_conninfo) == "ss_sink@127.0.0.1:5432/sessionstream_secure"
    assert Settings().database_conninfo == Settings().database_url
    assert redact_conninfo("postgresql://u:pw@h:1/d") == "u@h:1/d"


def test_librdkafka_debug_contexts_reach_every_client_and_typos_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import Consumer

    assert "debug" not in client_config(Settings())
    monkeypatch.setenv("SESSIONSTREAM_KAFKA_DEBUG", " cgrp, consumer ")
    s = Settings()
    assert client_config(s)["debug"] == "cgrp,consumer"
    Consumer(client_config(s, **{"group.id": "g"})).close()  # librdkafka takes it
    with pytest.raises(ValidationError, match=r"unknown librdkafka debug context.*cgrpp"):
        Settings(kafka_debug="cgrpp,fetch")
