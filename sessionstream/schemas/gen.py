"""`python -m sessionstream.schemas.gen`: rewrite sessionstream/schemas/avro/*.avsc from the
pydantic models."""

from __future__ import annotations

import json
from pathlib import Path

from sessionstream.schemas._avro import command_schema, event_schema

AVRO_DIR = Path(__file__).parent / "avro"


def render() -> dict[str, str]:
    """File name -> content of every generated schema file."""
    return {
        "command.avsc": json.dumps(command_schema(), indent=2) + "\n",
        "event.avsc": json.dumps(event_schema(), indent=2) + "\n",
    }


def main() -> None:
    AVRO_DIR.mkdir(exist_ok=True)
    for name, text in render().items():
        (AVRO_DIR / name).write_text(text)
        print(f"wrote {AVRO_DIR / name}")


if __name__ == "__main__":
    main()
