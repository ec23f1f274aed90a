"""The checked-in `sessionstream/schemas/avro/*.avsc` are the contract: they must equal what
the models give."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro

from sessionstream.schemas.gen import AVRO_DIR, render


def test_checked_in_schemas_match_the_models() -> None:
    rendered = render()
    on_disk = {p.name: p.read_text() for p in Path(AVRO_DIR).glob("*.avsc")}
    assert sorted(on_disk) == sorted(rendered), "a schema file is missing or left over"
    for name, text in rendered.items():
        assert on_disk[name] == text, (
            f"{name} drifted: run `python -m sessionstream.schemas.gen` and review"
        )


def test_checked_in_schemas_are_valid_avro() -> None:
    for text in render().values():
        schema = json.loads(text)
        fastavro.parse_schema(schema)
        # evolution rule: every optional envelope field has a default, so old readers cope
        for field in schema["fields"]:
            if isinstance(field["type"], list) and "null" in field["type"]:
                assert "default" in field, field["name"]
