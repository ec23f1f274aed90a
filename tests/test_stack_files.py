"""The native stack and docker-compose.yml must describe the same Kafka.

docker-compose.yml cannot run on the project's machines (no Docker engine), so this test is
what keeps its KAFKA_* settings in step with stack/kafka/server.properties.in.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Differences that are the point: container networking, the image's static quorum, paths.
EXPECTED_DIFFERENCES = {
    "advertised.listeners",
    "controller.quorum.bootstrap.servers",
    "controller.quorum.voters",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
    "listeners",
    "log.dirs",
    "heap.opts",
}


def _native() -> dict[str, str]:
    text = (REPO / "stack/kafka/server.properties.in").read_text()
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {key.strip(): value.strip() for key, value in pairs}


def _compose() -> dict[str, str]:
    text = (REPO / "docker-compose.yml").read_text()
    env = re.findall(r"^\s+KAFKA_([A-Z0-9_]+):\s*(.+?)\s*$", text, flags=re.M)
    return {name.lower().replace("_", "."): value.strip("\"'") for name, value in env}


def test_compose_kafka_settings_match_the_native_stack() -> None:
    native, compose = _native(), _compose()
    differing = {
        key: (native.get(key), compose.get(key))
        for key in native.keys() | compose.keys()
        if native.get(key) != compose.get(key) and key not in EXPECTED_DIFFERENCES
    }
    assert differing == {}


def test_compose_uses_the_same_ports_and_database() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    assert '"127.0.0.1:9092:9092"' in text
    assert '"127.0.0.1:5432:5432"' in text
    for key in ("POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"):
        assert re.search(rf"^\s+{key}: sessionstream$", text, flags=re.M), key
    assert "image: apache/kafka:4.1.2" in text
    assert "<kafka.version>4.1.2</kafka.version>" in (REPO / "stack/kafka/pom.xml").read_text()
