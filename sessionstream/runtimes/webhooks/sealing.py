"""Signing secrets sealed for PostgreSQL: AES-256-GCM under ``webhooks_secret_key``.

A secret must be usable to sign, so it cannot be kept as a hash alone (as an API key is):
the table holds it sealed, with its SHA-256 and its first characters beside it. A sealed
blob is ``01 | key fingerprint (4 bytes) | nonce (12) | ciphertext+tag``, and its
associated data is the subscription's id, so a blob copied onto another row does not open.
Several keys rotate: the first seals, the one whose fingerprint the blob names opens.
"""

from __future__ import annotations

import hashlib
import os
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sessionstream.errors import ConfigurationError

__all__ = ["SealedSecrets", "fingerprint"]

_VERSION: Final = b"\x01"
_NONCE: Final = 12


def fingerprint(key: bytes) -> bytes:
    """Four bytes naming a key (of its SHA-256), so a blob says which key sealed it."""
    return hashlib.sha256(b"sessionstream-webhooks\x00" + key).digest()[:4]


class SealedSecrets:
    """Seal and open secrets with the configured keys (the first seals)."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ConfigurationError(
                "webhooks need SESSIONSTREAM_WEBHOOKS_SECRET_KEY (openssl rand -base64 32)"
            )
        self._keys = {fingerprint(k): AESGCM(k) for k in keys}
        self._first = fingerprint(keys[0])

    def seal(self, secret: str, subscription_id: str) -> bytes:
        nonce = os.urandom(_NONCE)
        sealed = self._keys[self._first].encrypt(nonce, secret.encode(), subscription_id.encode())
        return _VERSION + self._first + nonce + sealed

    def open(self, blob: bytes, subscription_id: str) -> str:
        """The secret; `ConfigurationError` when no configured key sealed it (a key taken
        out of the rotation too early) or the blob is not this row's."""
        if blob[:1] != _VERSION or len(blob) < 1 + 4 + _NONCE + 16:
            raise ConfigurationError(f"webhook {subscription_id}: its sealed secret is malformed")
        aead = self._keys.get(blob[1:5])
        if aead is None:
            raise ConfigurationError(
                f"webhook {subscription_id}: its secret was sealed with key {blob[1:5].hex()}, "
                "which SESSIONSTREAM_WEBHOOKS_SECRET_KEY does not hold "
                f"(it holds {', '.join(k.hex() for k in self._keys)})"
            )
        try:
            opened = aead.decrypt(
                blob[5 : 5 + _NONCE], blob[5 + _NONCE :], subscription_id.encode()
            )
        except InvalidTag:
            raise ConfigurationError(
                f"webhook {subscription_id}: its sealed secret does not open (altered, or "
                "another row's)"
            ) from None
        return opened.decode()
