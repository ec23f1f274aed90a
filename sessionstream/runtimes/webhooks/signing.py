"""Standard Webhooks signatures (https://www.standardwebhooks.com, version 1.0.0, symmetric).

A secret is ``whsec_`` + the base64 of 32 random bytes (the specification asks for 24 to
64). A delivery carries ``webhook-id`` (the event's key), ``webhook-timestamp`` (the
attempt's time, integer seconds) and ``webhook-signature``: ``v1,`` + the base64 of
HMAC-SHA256(secret bytes, ``{id}.{timestamp}.{body}``). Each attempt is signed anew, so its
timestamp is fresh and a receiver can refuse old ones.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final

__all__ = [
    "SECRET_PREFIX",
    "delivery_headers",
    "new_secret",
    "secret_bytes",
    "secret_hash",
    "sign",
]

SECRET_PREFIX: Final = "whsec_"
#: random bytes in a new secret (the specification: at least 24, at most 64)
SECRET_BYTES: Final = 32


def new_secret() -> str:
    """A fresh signing secret, ``whsec_<base64>``."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_bytes(secret: str) -> bytes:
    """The HMAC key of a secret (with or without its ``whsec_`` prefix), or ValueError."""
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is whsec_ and base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"a webhook secret holds 24 to 64 bytes, not {len(key)}")
    return key


def secret_hash(secret: str) -> str:
    """SHA-256 of the secret's text, hex: what the table keeps to recognise a secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def sign(secret: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256>`` of ``{msg_id}.{timestamp}.{body}``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def delivery_headers(secret: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }
