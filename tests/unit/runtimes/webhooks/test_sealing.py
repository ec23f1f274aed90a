"""Secrets sealed for PostgreSQL: they open with the key that sealed them, for the row
they were sealed for, and rotate."""

from __future__ import annotations

import os

import pytest

from sessionstream.errors import ConfigurationError
from sessionstream.runtimes.webhooks.sealing import SealedSecrets, fingerprint

OLD, NEW = os.urandom(32), os.urandom(32)
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_a_sealed_secret_opens_for_its_row_only() -> None:
    s = SealedSecrets([NEW])
    blob = s.seal(SECRET, "wh_1")
    assert SECRET.encode() not in blob and s.open(blob, "wh_1") == SECRET
    assert s.seal(SECRET, "wh_1") != blob  # a fresh nonce each time
    with pytest.raises(ConfigurationError, match="does not open"):
        s.open(blob, "wh_2")  # copied onto another row


def test_an_altered_blob_does_not_open() -> None:
    s = SealedSecrets([NEW])
    blob = bytearray(s.seal(SECRET, "wh_1"))
    blob[-1] ^= 1
    with pytest.raises(ConfigurationError, match="does not open"):
        s.open(bytes(blob), "wh_1")
    with pytest.raises(ConfigurationError, match="malformed"):
        s.open(b"\x02" + bytes(blob[1:]), "wh_1")


def test_keys_rotate_the_first_seals_any_opens() -> None:
    sealed_before = SealedSecrets([OLD]).seal(SECRET, "wh_1")
    rotated = SealedSecrets([NEW, OLD])
    assert rotated.open(sealed_before, "wh_1") == SECRET
    sealed_after = rotated.seal(SECRET, "wh_2")
    assert sealed_after[1:5] == fingerprint(NEW)
    with pytest.raises(ConfigurationError, match=f"sealed with key {fingerprint(OLD).hex()}"):
        SealedSecrets([NEW]).open(sealed_before, "wh_1")


def test_no_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="SESSIONSTREAM_WEBHOOKS_SECRET_KEY"):
        SealedSecrets([])
