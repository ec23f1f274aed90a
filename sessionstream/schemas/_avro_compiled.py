"""Avro binary writers and readers compiled from our envelope schemas, for the hot path.

fastavro walks the schema for every record (a dict lookup per field, a union search per
payload); these functions are generated once per payload type from the same schema, so a
record is a straight run of field writes or reads. They cover the subset of Avro our
envelopes use — null, boolean, int, long, double, string, arrays, `["null", X]` unions, a
union of payload records, and strings of `logicalType: json` (a JSON value the model holds
parsed, written as its compact text) — and `compile_envelope` raises `Unsupported` for
anything else,
so the codec keeps fastavro for that schema. The bytes are fastavro's exactly (a unit test
compares the two on every payload type with generated values); the codec still reads every
writer schema it does not own with fastavro's schema resolution.

Readers build the models without validating them (`sessionstream.schemas._base.construct`): they are
for records in our current writer schema, which only our own processes write (the events
topic is written by the processor alone); a record whose `type` does not match its payload,
or whose bytes are cut short or left over, is refused (`ReadError`) and the codec falls
back to the validating path, which says what is wrong.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from typing import Any, Final

from pydantic import BaseModel

from sessionstream.errors import SessionstreamError
from sessionstream.schemas._base import construct

__all__ = ["Envelope", "ReadError", "Record", "Unsupported", "json_text", "json_value"]

_DOUBLE: Final = struct.Struct("<d")


class Unsupported(SessionstreamError, TypeError):
    """The schema uses Avro the compiler does not cover (the codec then uses fastavro)."""


class ReadError(SessionstreamError, ValueError):
    """The bytes are not a well-formed record of the compiled schema."""


# -- runtime helpers the generated code calls ------------------------------------------------
def _w_long(out: bytearray, n: int) -> None:
    if not -0x8000000000000000 <= n <= 0x7FFFFFFFFFFFFFFF:
        raise OverflowError(f"{n} does not fit an Avro long")
    n = (n << 1) ^ (n >> 63)
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


@functools.lru_cache(maxsize=1 << 14)
def _varint(n: int) -> bytes:
    """The zigzag varint of a long, memoised: the large longs an envelope holds are times,
    and a command's events share theirs (`ts`, `producerTs`)."""
    out = bytearray()
    _w_long(out, n)
    return bytes(out)


def _r_long(b: bytes, i: int) -> tuple[int, int]:
    # unrolled for the common lengths (times in milliseconds take 6 bytes)
    c = b[i]
    n = c & 0x7F
    if c < 0x80:
        return (n >> 1) ^ -(n & 1), i + 1
    c = b[i + 1]
    n |= (c & 0x7F) << 7
    if c < 0x80:
        return (n >> 1) ^ -(n & 1), i + 2
    c = b[i + 2]
    n |= (c & 0x7F) << 14
    if c < 0x80:
        return (n >> 1) ^ -(n & 1), i + 3
    c = b[i + 3]
    n |= (c & 0x7F) << 21
    if c < 0x80:
        return (n >> 1) ^ -(n & 1), i + 4
    c = b[i + 4]
    n |= (c & 0x7F) << 28
    if c < 0x80:
        return (n >> 1) ^ -(n & 1), i + 5
    c = b[i + 5]
    n |= (c & 0x7F) << 35
    if c < 0x80:
        return (n >> 1) ^ -(n & 1), i + 6
    i += 6
    shift = 42
    while c & 0x80:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if shift > 70:
            raise ReadError("varint longer than 10 bytes")
    return (n >> 1) ^ -(n & 1), i


def _r_str(b: bytes, i: int) -> tuple[str, int]:
    n, i = _r_long(b, i)
    j = i + n
    if n < 0 or j > len(b):
        raise ReadError("string runs past the record")
    return b[i:j].decode(), j


def json_text(value: Any) -> str:
    """The text a `logicalType: json` string holds: compact, non-ASCII kept, no NaN."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def json_value(text: str) -> Any:
    """The value a `logicalType: json` string holds; ReadError if it is no JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ReadError(f"a JSON field holds no JSON: {e}") from None


_RUNTIME: Final[dict[str, Any]] = {
    "_w_long": _w_long,
    "_varint": _varint,
    "_r_long": _r_long,
    "_r_str": _r_str,
    "_DOUBLE": _DOUBLE,
    "ReadError": ReadError,
    "_json_text": json_text,
    "_json_value": json_value,
}


# -- code generation ---------------------------------------------------------------------------
class _Gen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    # writers: `expr` is the value to write
    def write(self, t: Any, expr: str, d: int) -> None:
        if t == "null":
            return
        if t == "boolean":
            self.emit(d, f"out.append(1 if {expr} else 0)")
        elif t in ("int", "long"):
            # one-byte varints inline (0..63: zigzag 0..126)
            v = self.var()
            self.emit(d, f"{v} = {expr}")
            self.emit(d, f"if 0 <= {v} < 64:")
            self.emit(d + 1, f"out.append({v} << 1)")
            self.emit(d, "else:")
            self.emit(d + 1, f"out += _varint({v})")
        elif t == "string":
            v = self.var()
            self.emit(d, f"{v} = {expr}.encode()")
            self.emit(d, f"if len({v}) < 64:")
            self.emit(d + 1, f"out.append(len({v}) << 1)")
            self.emit(d, "else:")
            self.emit(d + 1, f"_w_long(out, len({v}))")
            self.emit(d, f"out += {v}")
        elif t == "double":
            self.emit(d, f"out += _DOUBLE.pack({expr})")
        elif isinstance(t, list) and len(t) == 2 and t[0] == "null":
            v = self.var()
            self.emit(d, f"{v} = {expr}")
            self.emit(d, f"if {v} is None:")
            self.emit(d + 1, "out.append(0)")
            self.emit(d, "else:")
            self.emit(d + 1, "out.append(2)")
            self.write(t[1], v, d + 1)
        elif _is_json(t):
            self.write("string", f"_json_text({expr})", d)
        elif isinstance(t, dict) and t.get("type") == "array":
            v, x = self.var(), self.var()
            self.emit(d, f"{v} = {expr}")
            self.emit(d, f"if {v}:")
            self.emit(d + 1, f"_w_long(out, len({v}))")
            self.emit(d + 1, f"for {x} in {v}:")
            self.write(t["items"], x, d + 2)
            self.emit(d, "out.append(0)")
        elif isinstance(t, dict) and t.get("type") in _PRIMITIVE_NAMES:
            self.write(t["type"], expr, d)
        else:
            raise Unsupported(f"cannot compile a writer for {t!r}")

    # readers: assigns the value read to `target`
    def read(self, t: Any, target: str, d: int) -> None:
        if t == "null":
            self.emit(d, f"{target} = None")
        elif t == "boolean":
            self.emit(d, f"{target} = b[i] == 1")
            self.emit(d, "if b[i] > 1:")
            self.emit(d + 1, "raise ReadError('boolean byte is neither 0 nor 1')")
            self.emit(d, "i += 1")
        elif t in ("int", "long"):
            # one-byte varints (most lengths, counts and small numbers) inline
            self.emit(d, "c = b[i]")
            self.emit(d, "if c < 0x80:")
            self.emit(d + 1, f"{target} = (c >> 1) ^ -(c & 1)")
            self.emit(d + 1, "i += 1")
            self.emit(d, "else:")
            self.emit(d + 1, f"{target}, i = _r_long(b, i)")
        elif t == "string":
            self.emit(d, "c = b[i]")
            self.emit(d, "if c < 0x80:")
            self.emit(d + 1, "if c & 1:")
            self.emit(d + 2, "raise ReadError('negative string length')")
            self.emit(d + 1, "j = i + 1 + (c >> 1)")
            self.emit(d + 1, f"{target} = b[i + 1 : j].decode()")
            self.emit(d + 1, "i = j")
            self.emit(d, "else:")
            self.emit(d + 1, f"{target}, i = _r_str(b, i)")
        elif t == "double":
            self.emit(d, f"({target},) = _DOUBLE.unpack_from(b, i)")
            self.emit(d, "i += 8")
        elif isinstance(t, list) and len(t) == 2 and t[0] == "null":
            u = self.var()
            self.emit(d, f"{u} = b[i]")
            self.emit(d, "i += 1")
            self.emit(d, f"if {u} == 0:")
            self.emit(d + 1, f"{target} = None")
            self.emit(d, f"elif {u} == 2:")
            self.read(t[1], target, d + 1)
            self.emit(d, "else:")
            self.emit(d + 1, "raise ReadError('union index out of range')")
        elif _is_json(t):
            text = self.var()
            self.read("string", text, d)
            self.emit(d, f"{target} = _json_value({text})")
        elif isinstance(t, dict) and t.get("type") == "array":
            lst, cnt, item = self.var(), self.var(), self.var()
            self.emit(d, f"{lst} = []")
            self.emit(d, "while True:")
            self.emit(d + 1, f"{cnt}, i = _r_long(b, i)")
            self.emit(d + 1, f"if {cnt} == 0:")
            self.emit(d + 2, "break")
            self.emit(d + 1, f"if {cnt} < 0:")  # a block with its byte size (spec)
            self.emit(d + 2, f"{cnt} = -{cnt}")
            self.emit(d + 2, "_, i = _r_long(b, i)")
            self.emit(d + 1, f"for _ in range({cnt}):")
            self.read(t["items"], item, d + 2)
            self.emit(d + 2, f"{lst}.append({item})")
            self.emit(d, f"{target} = {lst}")
        elif isinstance(t, dict) and t.get("type") in _PRIMITIVE_NAMES:
            self.read(t["type"], target, d)
        else:
            raise Unsupported(f"cannot compile a reader for {t!r}")


_PRIMITIVE_NAMES: Final = {"null", "boolean", "int", "long", "double", "string"}


def _is_json(t: Any) -> bool:
    return isinstance(t, dict) and t.get("type") == "string" and t.get("logicalType") == "json"


def _zigzag(n: int) -> bytearray:
    out = bytearray()
    _w_long(out, n)
    return out


def _names(model: type[BaseModel]) -> dict[str, str]:
    """Avro field name (the alias) -> the model's attribute name."""
    return {(info.alias or name): name for name, info in model.model_fields.items()}


def _compile(src: str, name: str) -> Callable[..., Any]:
    scope = dict(_RUNTIME)
    exec(compile(src, f"<avro {name}>", "exec"), scope)  # generated from our own schema
    fn: Callable[..., Any] = scope[name]
    return fn


class Envelope:
    """Compiled writers and readers of one envelope schema (commands or events).

    `write(model)` -> the record's bytes after the 10-byte header; `read(data, offset)` ->
    the validated-free model (`read_dict` -> the alias-keyed dict fastavro would give, for
    records that are validated next, e.g. commands from outside)."""

    def __init__(
        self,
        schema: dict[str, Any],
        envelope: type[BaseModel],
        payloads: dict[str, type[BaseModel]],
        header: bytes,
    ) -> None:
        fields = schema["fields"]
        if not fields or fields[-1]["name"] != "payload":
            raise Unsupported("the envelope's last field must be its payload union")
        records = fields[-1]["type"]
        env_names = _names(envelope)
        by_name = {m.__name__: m for m in payloads.values()}
        self.header = header
        self.type_of: dict[str, type[BaseModel]] = dict(payloads)
        self._writers: dict[type[BaseModel], Callable[[Any, bytes], bytes]] = {}
        self._readers: list[Callable[[bytes, int], tuple[dict[str, Any], int]]] = []
        self._dict_readers: list[Callable[[bytes, int], tuple[dict[str, Any], int]]] = []
        self._payload_classes: list[type[BaseModel]] = []
        self._payload_names: list[str] = []
        self.envelope = envelope
        env_fields = fields[:-1]
        for f in env_fields:
            if f["name"] not in env_names:
                raise Unsupported(f"envelope field {f['name']!r} is not on the model")
        for index, record in enumerate(records):
            model = by_name.get(record.get("name", ""))
            if model is None:
                raise Unsupported(f"no payload model for the union's {record.get('name')!r}")
            p_names = _names(model)
            self._writers[model] = self._writer(index, env_fields, env_names, record, p_names)
            self._readers.append(self._reader(index, record, p_names, alias=False))
            self._dict_readers.append(self._reader(index, record, p_names, alias=True))
            self._payload_classes.append(model)
            self._payload_names.append(f"{record.get('namespace', '')}.{record['name']}")
        self._read_envelope = self._envelope_reader(env_fields, env_names, alias=False)
        self._read_envelope_dict = self._envelope_reader(env_fields, env_names, alias=True)

    def _writer(
        self,
        index: int,
        env_fields: list[dict[str, Any]],
        env_names: dict[str, str],
        record: dict[str, Any],
        p_names: dict[str, str],
    ) -> Callable[[Any, bytes], bytes]:
        g = _Gen()
        name = f"write_{index}"
        g.emit(0, f"def {name}(m, header):")
        g.emit(1, "out = bytearray(header)")
        for f in env_fields:
            g.write(f["type"], f"m.{env_names[f['name']]}", 1)
        g.emit(1, "p = m.payload")
        g.emit(1, f"out += {bytes(_zigzag(index))!r}")
        for f in record["fields"]:
            if f["name"] not in p_names:
                raise Unsupported(f"payload field {f['name']!r} is not on the model")
            g.write(f["type"], f"p.{p_names[f['name']]}", 1)
        g.emit(1, "return bytes(out)")
        fn: Callable[[Any, bytes], bytes] = _compile("\n".join(g.lines), name)
        return fn

    def _reader(
        self, index: int, record: dict[str, Any], p_names: dict[str, str], alias: bool
    ) -> Callable[[bytes, int], tuple[dict[str, Any], int]]:
        """Reads one payload's fields (after its union index) into {name: value}, keyed by
        attribute (to construct) or by alias (to validate)."""
        g = _Gen()
        name = f"read_{index}"
        g.emit(0, f"def {name}(b, i):")
        targets = []
        for f in record["fields"]:
            v = g.var()
            g.read(f["type"], v, 1)
            key = f["name"] if alias else p_names[f["name"]]
            targets.append(f"{key!r}: {v}")
        g.emit(1, f"return {{{', '.join(targets)}}}, i")
        return _compile("\n".join(g.lines), name)

    def _envelope_reader(
        self, env_fields: list[dict[str, Any]], env_names: dict[str, str], alias: bool
    ) -> Callable[[bytes, int], tuple[dict[str, Any], int, int]]:
        """Reads the envelope's fields and the payload's union index: (fields, index, i);
        attribute-keyed in the model's field order, or alias-keyed."""
        g = _Gen()
        name = "read_envelope"
        g.emit(0, f"def {name}(b, i):")
        local: dict[str, str] = {}
        for f in env_fields:
            v = g.var()
            g.read(f["type"], v, 1)
            local[f["name"]] = v
        g.emit(1, "u, i = _r_long(b, i)")
        if alias:
            items = [f"{a!r}: {v}" for a, v in local.items()]
        else:
            order = [n for n in self.envelope.model_fields if n != "payload"]
            by_attr = {env_names[a]: v for a, v in local.items()}
            items = [f"{n!r}: {by_attr[n]}" for n in order]
            # the payload's place in the model's field order, filled in by `read`
            pos = list(self.envelope.model_fields).index("payload")
            items.insert(pos, "'payload': None")
        g.emit(1, f"return {{{', '.join(items)}}}, u, i")
        return _compile("\n".join(g.lines), name)

    # -- writing ----------------------------------------------------------------------------
    def write(self, model: Any, header: bytes | None = None) -> bytes:
        """The record of an envelope model behind `header` (default: the single-object
        header it was built with; the Confluent framing's `00` + schema id is another)."""
        writer = self._writers.get(type(model.payload))
        if writer is None:
            raise Unsupported(f"no compiled writer for {type(model.payload).__name__}")
        return writer(model, self.header if header is None else header)

    # -- reading ----------------------------------------------------------------------------
    def read(self, data: bytes, offset: int) -> Any:
        """The envelope model of the record in `data` from `offset`, not validated."""
        try:
            env, u, i = self._read_envelope(data, offset)
            if not 0 <= u < len(self._readers):
                raise ReadError(f"payload union index {u} out of range")
            values, i = self._readers[u](data, i)
        except (IndexError, UnicodeDecodeError, struct.error) as e:
            raise ReadError(f"{type(e).__name__}: {e}") from e
        if i != len(data):
            raise ReadError(f"{len(data) - i} trailing bytes")
        cls = self._payload_classes[u]
        if self.type_of.get(env["type"]) is not cls:
            raise ReadError(f"type {env['type']!r} does not carry {cls.__name__}")
        env["payload"] = construct(cls, values)
        return construct(self.envelope, env)

    def read_dict(self, data: bytes, offset: int) -> dict[str, Any]:
        """The alias-keyed record (payload as a dict), for validation next."""
        try:
            env, u, i = self._read_envelope_dict(data, offset)
            if not 0 <= u < len(self._dict_readers):
                raise ReadError(f"payload union index {u} out of range")
            env["payload"], i = self._dict_readers[u](data, i)
        except (IndexError, UnicodeDecodeError, struct.error) as e:
            raise ReadError(f"{type(e).__name__}: {e}") from e
        if i != len(data):
            raise ReadError(f"{len(data) - i} trailing bytes")
        return env


class Record:
    """Compiled writer and reader of one flat record schema (no payload union), such as the
    outcome records: `write(model, header)`, `read_dict(data, offset)` (alias-keyed)."""

    def __init__(self, schema: dict[str, Any], model: type[BaseModel]) -> None:
        fields = schema["fields"]
        names = _names(model)
        for f in fields:
            if f["name"] not in names:
                raise Unsupported(f"record field {f['name']!r} is not on the model")
        g = _Gen()
        g.emit(0, "def write_record(m, header):")
        g.emit(1, "out = bytearray(header)")
        for f in fields:
            g.write(f["type"], f"m.{names[f['name']]}", 1)
        g.emit(1, "return bytes(out)")
        self._write: Callable[[Any, bytes], bytes] = _compile("\n".join(g.lines), "write_record")
        r = _Gen()
        r.emit(0, "def read_record(b, i):")
        items = []
        for f in fields:
            v = r.var()
            r.read(f["type"], v, 1)
            items.append(f"{f['name']!r}: {v}")
        r.emit(1, f"return {{{', '.join(items)}}}, i")
        self._read: Callable[[bytes, int], tuple[dict[str, Any], int]] = _compile(
            "\n".join(r.lines), "read_record"
        )

    def write(self, model: Any, header: bytes) -> bytes:
        return self._write(model, header)

    def read_dict(self, data: bytes, offset: int) -> dict[str, Any]:
        try:
            values, i = self._read(data, offset)
        except (IndexError, UnicodeDecodeError, struct.error) as e:
            raise ReadError(f"{type(e).__name__}: {e}") from e
        if i != len(data):
            raise ReadError(f"{len(data) - i} trailing bytes")
        return values
