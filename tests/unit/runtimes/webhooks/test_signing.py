"""Standard Webhooks signatures: the specification's own test vector, and the secrets."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from sessionstream.runtimes.webhooks.signing import (
    delivery_headers,
    new_secret,
    secret_bytes,
    secret_hash,
    sign,
)

# libraries/python/tests/test_webhooks.py::test_sign_function of
# github.com/standard-webhooks/standard-webhooks (the reference implementation's vector)
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_specifications_vector() -> None:
    assert sign(secret_bytes(SPEC_SECRET), SPEC_ID, SPEC_TS, SPEC_BODY) == SPEC_SIGNATURE


def test_the_signed_bytes_are_id_dot_timestamp_dot_body() -> None:
    key = secret_bytes(SPEC_SECRET)
    body = '{"sessionId":"acme:s1","seq":1,"text":"ünïcode"}'.encode()
    msg_id = "acme:s1/8e752575-190a-5611-91bc-7607e9cf624d/0000000001"
    by_hand = hmac.new(key, f"{msg_id}.1767225600.".encode() + body, hashlib.sha256).digest()
    assert sign(key, msg_id, 1767225600, body) == "v1," + base64.b64encode(by_hand).decode()


def test_the_headers_of_an_attempt() -> None:
    key = secret_bytes(SPEC_SECRET)
    h = delivery_headers(key, SPEC_ID, SPEC_TS, SPEC_BODY)
    assert h == {
        "webhook-id": SPEC_ID,
        "webhook-timestamp": "1614265330",
        "webhook-signature": SPEC_SIGNATURE,
    }


def test_a_new_secret_is_whsec_and_32_random_bytes() -> None:
    a, b = new_secret(), new_secret()
    assert a.startswith("whsec_") and a != b
    assert len(secret_bytes(a)) == 32
    assert secret_hash(a) == hashlib.sha256(a.encode()).hexdigest()


@pytest.mark.parametrize(
    "bad",
    [
        "whsec_",
        "whsec_not base64!",
        "whsec_" + base64.b64encode(b"x" * 16).decode(),
        "whsec_" + base64.b64encode(b"x" * 65).decode(),
    ],
)
def test_a_secret_out_of_the_specifications_bounds_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        secret_bytes(bad)
