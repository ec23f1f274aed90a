"""Search cursors, from the spec: a cursor is opaque and tamper-evident. A forged, truncated,
altered or other-filters cursor, or another tenant's, is refused with a clear error code
(`invalid_cursor` or `cursor_mismatch`), never anything else; a genuine one resumes where
its page ended."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstream.runtimes.sink.cursor import (
    MAX_CURSOR_CHARS,
    CursorCodec,
    CursorError,
    CursorMismatch,
    InvalidCursor,
    Position,
    derive_key,
)
from sessionstream.runtimes.sink.search import Filters, Search

KEY = derive_key("a secret of at least thirty-two characters")
CODEC = CursorCodec(KEY)
ACME = Search("runs", "acme", Filters.of(status="failed", actor="alice"))
AT = Position(1_796_347_342_302_123, "c5e4f511-3efc-51ae-96cb-83e07242b0de")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_cursor_resumes_exactly_where_its_page_ended() -> None:
    cursor = CODEC.encode(AT, ACME.digest())
    assert CODEC.decode(cursor, ACME.digest()) == AT
    # opaque to the eye, and safe in a URL without escaping
    assert set(cursor) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
    assert AT.id not in cursor


def test_the_same_search_written_differently_is_the_same_search() -> None:
    a = Search("runs", "acme", Filters.of(status="failed,running", labels=["a:1", "b:2"]))
    b = Search("runs", "acme", Filters.of(status="running,failed", labels=["b:2", "a:1", "a:1"]))
    assert CODEC.decode(CODEC.encode(AT, a.digest()), b.digest()) == AT


def test_every_truncation_is_refused_as_invalid() -> None:
    cursor = CODEC.encode(AT, ACME.digest())
    for cut in range(len(cursor)):
        with pytest.raises(InvalidCursor):
            CODEC.decode(cursor[:cut], ACME.digest())


def test_every_single_character_change_is_refused_as_invalid() -> None:
    """Any character of the alphabet at any place, the last ones included (base64's unused
    low bits: a change there decodes to the same bytes, and is refused all the same)."""
    cursor = CODEC.encode(AT, ACME.digest())
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.="
    for i, ch in enumerate(cursor):
        for other in alphabet:
            if other == ch:
                continue
            tampered = cursor[:i] + other + cursor[i + 1 :]
            with pytest.raises(InvalidCursor):
                CODEC.decode(tampered, ACME.digest())


def test_a_payload_edited_to_another_position_keeps_no_valid_signature() -> None:
    """What an attacker would do: decode the payload, move the position (e.g. far back or
    to a row id of their choosing), re-encode it, keep the tag."""
    payload_b64, tag = CODEC.encode(AT, ACME.digest()).split(".")
    version, at_us, row_id, digest = json.loads(base64.urlsafe_b64decode(payload_b64 + "=="))
    for edited in ([version, at_us * 2, row_id, digest], [version, at_us, "' or 1=1 --", digest]):
        forged = _b64(json.dumps(edited, separators=(",", ":")).encode()) + "." + tag
        with pytest.raises(InvalidCursor):
            CODEC.decode(forged, ACME.digest())


@pytest.mark.parametrize("guess", ["", "secret", "sessionstream", "changeme"])
def test_a_cursor_signed_with_a_guessed_key_is_refused(guess: str) -> None:
    payload = json.dumps([1, 0, "x", ACME.digest()], separators=(",", ":")).encode()
    for key in (guess.encode(), derive_key(guess) if guess else b""):
        tag = hmac.new(key, payload, hashlib.sha256).digest()[:16]
        with pytest.raises(InvalidCursor):
            CODEC.decode(_b64(payload) + "." + _b64(tag), ACME.digest())


def test_another_keys_cursor_is_refused() -> None:
    """Another gateway's, or this one's before a restart without a configured secret."""
    other = CursorCodec(derive_key("another secret of at least thirty-two characters"))
    with pytest.raises(InvalidCursor):
        CODEC.decode(other.encode(AT, ACME.digest()), ACME.digest())


def test_a_cursor_of_other_filters_is_a_mismatch() -> None:
    cursor = CODEC.encode(AT, ACME.digest())
    for other in (
        Search("runs", "acme", Filters.of(status="failed")),  # a filter dropped
        Search("runs", "acme", Filters.of(status="failed,running", actor="alice")),
        Search("runs", "acme", Filters.of(status="failed", actor="bob")),
        Search("runs", "acme", Filters.of(status="failed", actor="alice", labels=["a:1"])),
        Search("runs", "acme", Filters.of(status="failed", actor="alice", since="0")),
        Search("runs", "acme", Filters.of(status="failed", actor="alice", until="1")),
        Search("runs", "acme", Filters.of(status="failed", actor="alice", session_id="acme:s")),
        Search("sessions", "acme", Filters.of(status="running", actor="alice")),
    ):
        with pytest.raises(CursorMismatch) as e:
            CODEC.decode(cursor, other.digest())
        assert e.value.code == "cursor_mismatch"


def test_another_tenants_cursor_is_a_mismatch_whatever_the_filters() -> None:
    cursor = CODEC.encode(AT, ACME.digest())
    globex = Search("runs", "globex", ACME.filters)
    with pytest.raises(CursorMismatch):
        CODEC.decode(cursor, globex.digest())
    # and no tenant at all (an operator's search of every tenant) is another search too
    with pytest.raises(CursorMismatch):
        CODEC.decode(cursor, Search("runs", None, ACME.filters).digest())


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        ".",
        "..",
        "a.b.c",
        "not a cursor",
        "====.====",
        "é.é",
        "\x00.\x00",
        "x" * (MAX_CURSOR_CHARS + 1),
        _b64(b'[1,0,"x","d"]') + ".",
        "." + _b64(b"0" * 16),
    ],
)
def test_garbage_is_invalid_never_another_error(garbage: str) -> None:
    with pytest.raises(InvalidCursor) as e:
        CODEC.decode(garbage, ACME.digest())
    assert e.value.code == "invalid_cursor"


@given(st.text(max_size=300))
def test_any_text_is_refused_with_a_cursor_error_only(text: str) -> None:
    with pytest.raises(CursorError):
        CODEC.decode(text, ACME.digest())


def test_keys_are_derived_per_purpose_and_must_be_long_enough() -> None:
    assert derive_key("s" * 32) != derive_key("s" * 32, "cli-search-cursor")
    assert derive_key("s" * 32) == derive_key(b"s" * 32)
    with pytest.raises(ValueError):
        CursorCodec(b"short")
