"""`sessionstream prompt --input JSON`: a typed input that is no JSON, or JSON the protocol
cannot carry, stops the CLI (exit 2) with the reason before anything is sent."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sessionstream.apps.cli import app


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("{sku: A-1}", "--input is not JSON"),
        ("NaN", "the prompt is not valid: input: Value error, the input holds nan"),
        ("[" * 70 + "]" * 70, "the input nests deeper than 64 levels"),
    ],
    ids=["not JSON", "NaN", "too deep"],
)
def test_an_input_the_protocol_cannot_carry_stops_the_cli_before_sending(
    given: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a broker nobody listens on: reaching it would hang or fail otherwise
    monkeypatch.setenv("SESSIONSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:9")
    done = CliRunner().invoke(app, ["prompt", "acme:s1", "quote it", "--input", given])
    assert done.exit_code == 2, done.output
    assert says in done.output, done.output
