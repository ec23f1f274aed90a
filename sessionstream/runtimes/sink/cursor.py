"""Search cursors: where a page of runs or sessions ended, signed so that a client can only
hand back what it was given.

A cursor is ``base64url(payload) "." base64url(tag)``: the payload is the compact JSON
``[1, at_us, id, digest]`` (format version, the last row's time in epoch microseconds and
its id, the digest of the search it belongs to) and the tag its HMAC-SHA256, cut to 16
bytes, under the holder's key. The key is what makes a cursor tamper-evident; the digest
(the tenant and every filter, `sessionstream.runtimes.sink.search`) is what ties it to
one search, so a cursor of other filters or of another tenant is refused rather than
quietly resuming somewhere else.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

from sessionstream.errors import SessionstreamError

__all__ = [
    "MAX_CURSOR_CHARS",
    "CursorCodec",
    "CursorError",
    "CursorMismatch",
    "InvalidCursor",
    "Position",
    "derive_key",
]

_VERSION = 1
_TAG_BYTES = 16
#: longer than any cursor this module makes (an id is at most 200 characters)
MAX_CURSOR_CHARS = 1024


class CursorError(SessionstreamError):
    """A cursor that cannot resume this search; `code` names why (docs/http.md)."""

    code = "invalid_cursor"


class InvalidCursor(CursorError):
    """Not a cursor this key made: altered, cut short, not base64, or signed with another
    key (another gateway's, or this one's before a restart without a configured key)."""

    code = "invalid_cursor"


class CursorMismatch(CursorError):
    """A genuine cursor of another search: other filters, or another tenant's."""

    code = "cursor_mismatch"


@dataclass(frozen=True)
class Position:
    """The last row of a page in the search's order: its time and its id."""

    at_us: int
    id: str


def derive_key(secret: str | bytes, purpose: str = "search-cursor") -> bytes:
    """The HMAC key of `purpose`, derived from a configured secret (so the secret could sign
    something else one day without a cursor ever being valid there)."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(raw, f"sessionstream {purpose} v{_VERSION}".encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or not text.isascii():
        raise InvalidCursor("not base64url")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise InvalidCursor("not base64url") from None
    # one spelling per cursor: a last character whose unused bits were changed decodes to
    # the same bytes, and is refused like any other change
    if _b64(data) != text:
        raise InvalidCursor("not base64url")
    return data


class CursorCodec:
    """Makes and checks the cursors of one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a cursor key needs at least 16 bytes")
        self._key = key

    def _tag(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:_TAG_BYTES]

    def encode(self, position: Position, digest: str) -> str:
        payload = json.dumps(
            [_VERSION, position.at_us, position.id, digest], separators=(",", ":")
        ).encode()
        return f"{_b64(payload)}.{_b64(self._tag(payload))}"

    def decode(self, cursor: str, digest: str) -> Position:
        """The position `cursor` holds, if this key made it for the search of `digest`;
        `InvalidCursor` or `CursorMismatch` otherwise (never anything else)."""
        # Step 1: the shape, before any work proportional to the input
        if len(cursor) > MAX_CURSOR_CHARS or cursor.count(".") != 1:
            raise InvalidCursor("not a cursor")
        head, _, tail = cursor.partition(".")
        payload, tag = _unb64(head), _unb64(tail)
        # Step 2: the tag, in constant time: nothing of the payload is believed before it
        if len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, self._tag(payload)):
            raise InvalidCursor("the cursor's signature does not match")
        # Step 3: what it says (a cursor of a later format under the same key is refused)
        try:
            version, at_us, row_id, made_for = json.loads(payload)
        except (ValueError, TypeError):
            raise InvalidCursor("not a cursor") from None
        if (
            version != _VERSION
            or type(at_us) is not int
            or not isinstance(row_id, str)
            or not isinstance(made_for, str)
        ):
            raise InvalidCursor("not a cursor of this version")
        # Step 4: the search it was made for
        if made_for != digest:  # not secret: the tag already proved who made it
            raise CursorMismatch("the cursor belongs to another search")
        return Position(at_us, row_id)
