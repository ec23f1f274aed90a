"""Bytes <-> models: Avro in the Confluent wire format; single-object encoding still read.

What sessionstream writes in Avro is framed as Kafka's tools expect it (Kafka Connect's
converters, Flink's ``avro-confluent``, ksqlDB, ``AvroDeserializer``): a zero byte, the
writer schema's id in a schema registry (4 bytes, big-endian), the Avro binary. The ids
come from a `SchemaSource` (an adapter over the registry, `sessionstream.adapters.registry`): the
id of each current schema is resolved once, when the codec is made, so the same model
always encodes to the same bytes; a reader asks for any other id once and keeps it.

Records written before (Avro single-object encoding: ``C3 01`` and the 8-byte
CRC-64-AVRO fingerprint of the writer schema) are still read, through the schemas kept in
``avro/history``; a codec without a `SchemaSource` writes that form (the pure tests, tools
with no registry). A UTF-8 JSON object (first non-blank byte ``{``) with camelCase names is
accepted for commands, so producers in other languages need no Avro. Anything else is a
typed `DecodeError`.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from importlib import resources
from typing import Any, Final, Protocol

import fastavro
import fastavro.read
import fastavro.write
from fastavro.schema import to_parsing_canonical_form
from pydantic import ValidationError

from sessionstream.schemas._avro import command_schema, event_schema, outcome_schema
from sessionstream.schemas._avro_compiled import (
    Envelope,
    ReadError,
    Record,
    Unsupported,
    json_text,
    json_value,
)
from sessionstream.schemas._base import Payload, WireModel
from sessionstream.schemas.commands import COMMAND_PAYLOADS, Command
from sessionstream.schemas.errors import (
    MalformedRecord,
    OversizedRecord,
    SchemaViolation,
    UnknownSchema,
    UnknownType,
)
from sessionstream.schemas.events import EVENT_PAYLOADS, Event
from sessionstream.schemas.outcomes import CommandOutcome

__all__ = [
    "CONFLUENT_MAGIC",
    "DEFAULT_MAX_RECORD_BYTES",
    "MAGIC",
    "Codec",
    "SchemaSource",
    "confluent_header",
    "crc64_avro",
    "single_object_header",
]

MAGIC: Final = b"\xc3\x01"
#: the Confluent wire format's first byte; the schema id (4 bytes, big-endian) follows
CONFLUENT_MAGIC: Final = b"\x00"
#: records larger than this are dead letters (the broker's default message.max.bytes is 1 MiB)
DEFAULT_MAX_RECORD_BYTES: Final = 900 * 1024

_EMPTY64: Final = 0xC15D213AA4D7A795

# fastavro (the path for writer schemas other than the current one, and for anything the
# compiled code refuses) reads and writes a `logicalType: json` string as the compiled code
# does: the model's JSON value <-> its text. Registered in fastavro's own tables of logical
# types, as its documentation describes custom ones.
fastavro.write.LOGICAL_WRITERS["string-json"] = lambda datum, schema: json_text(datum)
fastavro.read.LOGICAL_READERS["string-json"] = lambda data, writer, reader: json_value(data)


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_TABLE: Final = _crc_table()


def crc64_avro(data: bytes) -> int:
    """The Avro spec's CRC-64-AVRO (Rabin) fingerprint."""
    fp = _EMPTY64
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


def single_object_header(schema: dict[str, Any]) -> bytes:
    """`C3 01` + fingerprint (little-endian) of the schema's parsing canonical form."""
    canonical = to_parsing_canonical_form(schema)
    return MAGIC + crc64_avro(canonical.encode()).to_bytes(8, "little")


def confluent_header(schema_id: int) -> bytes:
    """`00` + the registry id of the writer schema (big-endian)."""
    return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")


class SchemaSource(Protocol):
    """Where a codec gets registry schema ids (`sessionstream.adapters.registry` is one)."""

    def writer_id(self, kind: str) -> int | None:
        """The id of this version's schema of `kind` (``command``, ``event``,
        ``outcome``), resolved beforehand; None: this codec does not write that kind."""

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The writer schema of `schema_id`; `UnknownSchema` when the registry has none by
        that id. While the registry does not answer, it waits (never a wrong answer)."""


class _Kind:
    """One envelope kind (commands or events): its current schema and known writers."""

    def __init__(
        self,
        name: str,
        current: dict[str, Any],
        registry: dict[str, type[Payload]],
        envelope: type[WireModel],
    ):
        self.name = name
        self.registry = registry
        self.schema = fastavro.parse_schema(current)
        self.canonical = to_parsing_canonical_form(current)
        self.header = single_object_header(current)
        self.writers: dict[bytes, Any] = {self.header[2:]: self.schema}
        #: writer schemas by registry id, as asked for (the current one's id too)
        self.by_id: dict[int, Any] = {}
        #: what this codec writes: the Confluent header of the current schema's id, or
        #: None (single-object encoding)
        self.confluent: bytes | None = None
        self.current_id: int | None = None
        #: Confluent headers whose id is the current schema (read by the compiled path):
        #: the id written with, and any id the registry showed to hold the same schema
        self.current_headers: set[bytes] = set()
        self.payload_names: dict[type[Payload], str] = {}
        ns = f"sessionstream.{current['name'].lower()}"
        for model in registry.values():
            self.payload_names[model] = f"{ns}.{model.__name__}"
        #: the current schema's compiled writer and reader (None: fastavro does it all)
        self.compiled: Envelope | None
        try:
            self.compiled = Envelope(current, envelope, dict(registry), self.header)
        except Unsupported:
            self.compiled = None

    def add_writer(self, schema: dict[str, Any]) -> bytes:
        header = single_object_header(schema)
        self.writers[header[2:]] = fastavro.parse_schema(schema)
        return header

    def use_id(self, schema_id: int) -> None:
        """Write the Confluent framing with `schema_id`, the current schema's id."""
        self.current_id = schema_id
        self.confluent = confluent_header(schema_id)
        self.by_id[schema_id] = self.schema
        self.current_headers.add(self.confluent)

    @property
    def write_header(self) -> bytes:
        return self.confluent if self.confluent is not None else self.header


class _RecordKind:
    """The outcome records: a flat record, in the Confluent framing when the codec has a
    registry id, else in the single-object encoding (a deployment without a registry)."""

    name = "outcome"

    def __init__(self) -> None:
        current = outcome_schema()
        self.schema = fastavro.parse_schema(current)
        self.canonical = to_parsing_canonical_form(current)
        self.compiled = Record(current, CommandOutcome)
        self.header = single_object_header(current)
        self.by_id: dict[int, Any] = {}
        self.confluent: bytes | None = None
        self.current_id: int | None = None
        self.current_headers: set[bytes] = set()

    def use_id(self, schema_id: int) -> None:
        self.current_id = schema_id
        self.confluent = confluent_header(schema_id)
        self.by_id[schema_id] = self.schema
        self.current_headers.add(self.confluent)


def _history(prefix: str) -> list[dict[str, Any]]:
    """Older writer schemas kept under avro/history/ so their records stay readable."""
    out = []
    root = resources.files("sessionstream.schemas") / "avro" / "history"
    if root.is_dir():
        for entry in sorted(root.iterdir(), key=lambda e: e.name):
            if entry.name.startswith(prefix) and entry.name.endswith(".avsc"):
                out.append(json.loads(entry.read_text()))
    return out


def _kinds() -> tuple[_Kind, _Kind]:
    cmd = _Kind("command", command_schema(), COMMAND_PAYLOADS, Command)
    evt = _Kind("event", event_schema(), EVENT_PAYLOADS, Event)
    for old in _history("command"):
        cmd.add_writer(old)
    for old in _history("event"):
        evt.add_writer(old)
    return cmd, evt


def _violation(kind: str, err: ValidationError, size: int) -> SchemaViolation:
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(str(x) for x in e["loc"]) or kind
        parts.append(f"{loc}: {e['msg']}")
    return SchemaViolation(f"{kind} violates its schema: " + "; ".join(parts), size=size)


class Codec:
    """Encode and decode commands and events. Thread-safe; holds no I/O (a `SchemaSource`
    may: it is asked for a schema id once)."""

    def __init__(
        self,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        schemas: SchemaSource | None = None,
    ) -> None:
        self.max_record_bytes = max_record_bytes
        # each codec owns its writer registry, so registering a schema stays local
        self._cmd, self._evt = _kinds()
        self._out = _RecordKind()
        self._schemas: SchemaSource | None = None
        self._fetching = threading.Lock()
        if schemas is not None:
            self.attach(schemas)

    def attach(self, schemas: SchemaSource) -> None:
        """Read registry ids through `schemas` from now on, and write each kind it has an
        id for in the Confluent framing (a process attaches its registry when it starts,
        before the codec is used by more than one thread)."""
        self._schemas = schemas
        for kind in (self._cmd, self._evt, self._out):
            schema_id = schemas.writer_id(kind.name)
            if schema_id is not None:
                kind.use_id(schema_id)

    @property
    def framing(self) -> str:
        """What the codec writes: ``confluent`` (registry ids) or ``single-object``."""
        return "confluent" if self._evt.confluent or self._cmd.confluent else "single-object"

    def schema_ids(self) -> dict[str, int | None]:
        """The registry ids this codec writes with, by kind (None: single-object)."""
        return {
            "command": self._cmd.current_id,
            "event": self._evt.current_id,
            "outcome": self._out.current_id,
        }

    # -- encoding ---------------------------------------------------------------------------
    def _encode(self, kind: _Kind, model: Command | Event) -> bytes:
        header = kind.write_header
        if kind.compiled is not None:
            with contextlib.suppress(Unsupported):
                return kind.compiled.write(model, header)
        record = model.model_dump(by_alias=True)
        record["payload"] = (kind.payload_names[type(model.payload)], record["payload"])
        buf = io.BytesIO()
        buf.write(header)
        fastavro.schemaless_writer(buf, kind.schema, record)
        return buf.getvalue()

    def encode_command(self, command: Command) -> bytes:
        """Avro of a command, in the Confluent framing when the codec has a registry id."""
        return self._encode(self._cmd, command)

    def encode_event(self, event: Event) -> bytes:
        """Avro of an event (deterministic: same event, same bytes)."""
        return self._encode(self._evt, event)

    def encode_outcome(self, outcome: CommandOutcome) -> bytes:
        """An outcome record: the Confluent framing with a registry id, else single-object."""
        out = self._out
        return out.compiled.write(outcome, out.confluent or out.header)

    def decode_outcome(self, data: bytes) -> CommandOutcome:
        """An outcome record (the Confluent framing only; its schema by id)."""
        out = self._out
        size = len(data)
        if size > self.max_record_bytes:
            raise OversizedRecord(f"outcome record of {size} bytes", size=size)
        if data[:10] == out.header:
            return self._compiled_outcome(data, 10)
        if data[:1] != CONFLUENT_MAGIC or size < 5:
            raise MalformedRecord(
                f"outcome record is neither in the Confluent framing nor single-object; "
                f"first bytes: {data[:8].hex() or 'empty'}",
                size=size,
            )
        if data[:5] not in out.current_headers:
            writer = self._writer_by_id(out, data)  # type: ignore[arg-type]
            if data[:5] not in out.current_headers:
                record = self._read_body(out, data, 5, writer)  # type: ignore[arg-type]
                try:
                    return CommandOutcome.model_validate(record)
                except ValidationError as e:
                    raise _violation("outcome", e, size) from e
        return self._compiled_outcome(data, 5)

    def _compiled_outcome(self, data: bytes, offset: int) -> CommandOutcome:
        """The body after its header, read by this version's compiled reader."""
        size = len(data)
        try:
            record = self._out.compiled.read_dict(data, offset)
        except ReadError as e:
            raise MalformedRecord(f"corrupt outcome record: {e}", size=size) from e
        try:
            return CommandOutcome.model_validate(record)
        except ValidationError as e:
            raise _violation("outcome", e, size) from e

    def peek_ids(self, data: bytes) -> tuple[str | None, str | None]:
        """(sessionId, commandId) of a command record that cannot be decided (a dead
        letter), when they can be read at all: for its outcome record. Never raises."""
        try:  # no size check: the record is read already, and an oversized one has ids too
            if data[:1] == CONFLUENT_MAGIC:
                record = self._read_confluent(self._cmd, data)
            elif data[:2] == MAGIC:
                record = self._read_avro(self._cmd, data)
            elif data.lstrip()[:1] == b"{":
                record = json.loads(data.decode("utf-8"))
            else:
                return None, None
        except Exception:  # whatever is wrong with it is the dead letter's reason
            return None, None
        if not isinstance(record, dict):
            return None, None
        sid, cid = record.get("sessionId"), record.get("commandId")
        return (
            sid if isinstance(sid, str) and sid else None,
            cid if isinstance(cid, str) and cid else None,
        )

    @staticmethod
    def command_to_json(command: Command) -> bytes:
        """The JSON form of a command, as a producer in another language would write it."""
        return command.model_dump_json(by_alias=True).encode()

    @staticmethod
    def event_to_json(event: Event) -> dict[str, Any]:
        """The seed's JSON event format (camelCase)."""
        return event.model_dump(by_alias=True, mode="json")

    # -- decoding ---------------------------------------------------------------------------
    def _check_size(self, kind: _Kind, data: bytes) -> None:
        size = len(data)
        if size > self.max_record_bytes:
            raise OversizedRecord(
                f"{kind.name} record of {size} bytes exceeds the maximum of "
                f"{self.max_record_bytes} bytes",
                size=size,
            )

    def _decode(self, kind: _Kind, data: bytes, allow_json: bool) -> Any:
        self._check_size(kind, data)
        size = len(data)
        if data[:1] == CONFLUENT_MAGIC:
            record = self._read_confluent(kind, data)
        elif data[:2] == MAGIC:
            record = self._read_avro(kind, data)
        elif allow_json and data.lstrip()[:1] == b"{":
            record = self._read_json(kind, data)
        else:
            what = "Avro in the Confluent framing (00 + schema id), Avro single-object (C3 01)"
            what += ", nor a JSON object" if allow_json else ""
            raise MalformedRecord(
                f"{kind.name} record is neither {what}; first bytes: {data[:8].hex() or 'empty'}",
                size=size,
            )
        type_name = record.get("type")
        if not isinstance(type_name, str) or type_name not in kind.registry:
            raise UnknownType(
                f"unknown {kind.name} type {type_name!r}", type_name=str(type_name), size=size
            )
        return record

    def _read_avro(self, kind: _Kind, data: bytes) -> dict[str, Any]:
        size = len(data)
        if size < 10:
            raise MalformedRecord(f"truncated Avro header ({size} bytes)", size=size)
        if kind.compiled is not None and data[:10] == kind.header:
            # our current schema: the compiled reader; what it refuses, fastavro reads (and
            # says what is wrong)
            with contextlib.suppress(ReadError):
                return kind.compiled.read_dict(data, 10)
        fingerprint = data[2:10]
        writer = kind.writers.get(fingerprint)
        if writer is None:
            raise UnknownSchema(
                f"unknown {kind.name} writer schema, fingerprint {fingerprint.hex()}",
                fingerprint=fingerprint,
                size=size,
            )
        return self._read_body(kind, data, 10, writer)

    def _read_confluent(self, kind: _Kind, data: bytes) -> dict[str, Any]:
        size = len(data)
        if size < 5:
            raise MalformedRecord(f"truncated Confluent header ({size} bytes)", size=size)
        if kind.compiled is not None and data[:5] in kind.current_headers:
            with contextlib.suppress(ReadError):
                return kind.compiled.read_dict(data, 5)
        writer = self._writer_by_id(kind, data)
        if kind.compiled is not None and data[:5] in kind.current_headers:
            with contextlib.suppress(ReadError):  # the id turned out to be ours
                return kind.compiled.read_dict(data, 5)
        return self._read_body(kind, data, 5, writer)

    def _writer_by_id(self, kind: _Kind, data: bytes) -> Any:
        schema_id = int.from_bytes(data[1:5], "big")
        writer = kind.by_id.get(schema_id)
        if writer is not None:
            return writer
        if self._schemas is None:
            raise UnknownSchema(
                f"{kind.name} record names registry schema id {schema_id}, and this reader "
                "has no schema registry",
                fingerprint=data[:5],
                schema_id=schema_id,
                size=len(data),
            )
        with self._fetching:  # one fetch per id, however many threads meet it
            writer = kind.by_id.get(schema_id)
            if writer is None:
                raw = self._schemas.schema(schema_id)
                try:
                    if to_parsing_canonical_form(raw) == kind.canonical:
                        # this version's own schema under that id: the compiled path
                        kind.current_headers.add(data[:5])
                        kind.by_id[schema_id] = kind.schema
                        return kind.schema
                    writer = fastavro.parse_schema(raw)
                except Exception as e:  # fastavro raises SchemaParseException, ValueError, ...
                    raise UnknownSchema(
                        f"registry schema id {schema_id} is no Avro schema this reader can "
                        f"parse: {type(e).__name__}: {e}",
                        fingerprint=data[:5],
                        schema_id=schema_id,
                        size=len(data),
                    ) from e
                kind.by_id[schema_id] = writer
        return writer

    def _read_body(self, kind: _Kind, data: bytes, offset: int, writer: Any) -> dict[str, Any]:
        size = len(data)
        buf = io.BytesIO(data)
        buf.seek(offset)
        try:
            reader = None if writer is kind.schema else kind.schema
            record = fastavro.schemaless_reader(buf, writer, reader, return_record_name=True)
        except Exception as e:  # fastavro raises EOFError, ValueError, IndexError, ...
            raise MalformedRecord(
                f"corrupt or truncated Avro {kind.name}: {type(e).__name__}: {e}", size=size
            ) from e
        if buf.tell() != size:
            raise MalformedRecord(
                f"{size - buf.tell()} trailing bytes after the Avro {kind.name}", size=size
            )
        if not isinstance(record, dict):
            raise MalformedRecord(f"Avro {kind.name} is not a record", size=size)
        payload = record.get("payload")
        if isinstance(payload, tuple):
            record["payload"] = payload[1]
        return record

    def _read_json(self, kind: _Kind, data: bytes) -> dict[str, Any]:
        size = len(data)
        try:
            record = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise MalformedRecord(f"JSON {kind.name} is not UTF-8: {e}", size=size) from e
        except (ValueError, RecursionError) as e:
            # JSONDecodeError, but also an integer beyond Python's digit limit (ValueError)
            # and deep nesting (RecursionError): a poison record must not crash the processor
            raise MalformedRecord(
                f"invalid JSON {kind.name}: {type(e).__name__}: {e}", size=size
            ) from e
        if not isinstance(record, dict):
            raise MalformedRecord(f"JSON {kind.name} is not an object", size=size)
        if b"\\u" in data:
            # a `\ud800` escape decodes to a lone surrogate, which no UTF-8 writer (the
            # decider's size check, the Avro encoder) can write
            try:
                json.dumps(record, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as e:
                raise MalformedRecord(
                    f"JSON {kind.name} escapes a lone surrogate: {e}", size=size
                ) from e
        return record

    def decode_command(self, data: bytes) -> Command:
        """Avro or JSON bytes -> Command, or a typed DecodeError saying what was wrong."""
        record = self._decode(self._cmd, data, allow_json=True)
        try:
            return Command.model_validate(record)
        except ValidationError as e:
            raise _violation("command", e, len(data)) from e

    def decode_event(self, data: bytes, *, validate: bool = False) -> Event:
        """Avro bytes -> Event.

        A record in the current event schema is built without pydantic validation (only the
        processor writes events, through `encode_event`; the bytes are still checked to be
        one well-formed record whose `type` matches its payload); `validate=True`, or any
        other writer schema, validates it."""
        evt = self._evt
        if not validate and evt.compiled is not None:
            offset = 5 if data[:5] in evt.current_headers else 10 if data[:10] == evt.header else 0
            if offset:
                self._check_size(evt, data)
                with contextlib.suppress(ReadError):
                    event: Event = evt.compiled.read(data, offset)
                    return event
        record = self._decode(self._evt, data, allow_json=False)
        try:
            return Event.model_validate(record)
        except ValidationError as e:
            raise _violation("event", e, len(data)) from e

    def add_command_writer_schema(self, schema: dict[str, Any]) -> bytes:
        """Register another writer schema (e.g. a newer producer's); returns its header."""
        return self._cmd.add_writer(schema)

    def add_event_writer_schema(self, schema: dict[str, Any]) -> bytes:
        return self._evt.add_writer(schema)
