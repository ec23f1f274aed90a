"""docs/examples/webhook_receiver.py, the receiver users copy: it takes what the deliverer
signs, once, and refuses forged, stale and replayed deliveries."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from sessionstream.runtimes.webhooks.dispatch import Job, Target
from sessionstream.runtimes.webhooks.guard import AddressPolicy
from sessionstream.runtimes.webhooks.sender import Sender
from sessionstream.runtimes.webhooks.signing import delivery_headers, new_secret, secret_bytes
from tests.webhook_example import example_receiver

rx = example_receiver()
SECRET = new_secret()
KEY = secret_bytes(SECRET)
BODY = json.dumps({"sessionId": "acme:s1", "runId": "r", "seq": 1, "type": "run.started"}).encode()
MSG = "acme:s1/r/0000000001"
NOW = 1767225600


def signed(ts: int = NOW, body: bytes = BODY, key: bytes = KEY) -> dict[str, str]:
    return delivery_headers(key, MSG, ts, body)


def test_a_delivery_signed_with_the_secret_verifies() -> None:
    assert rx.verify(SECRET, signed(), BODY, now=NOW) == (MSG, NOW)
    assert rx.verify(SECRET, signed(NOW - 299), BODY, now=NOW) == (MSG, NOW - 299)


@pytest.mark.parametrize(
    ("headers", "body", "status", "why"),
    [
        (signed(key=b"x" * 32), BODY, 401, "no valid signature"),  # forged: another key
        (signed(), BODY + b" ", 401, "no valid signature"),  # body altered
        ({**signed(), "webhook-id": "acme:s1/r/0000000002"}, BODY, 401, "no valid signature"),
        ({**signed(), "webhook-timestamp": str(NOW + 1)}, BODY, 401, "no valid signature"),
        ({**signed(), "webhook-signature": "v1,"}, BODY, 401, "no valid signature"),
        (
            {**signed(), "webhook-signature": "v2," + signed()["webhook-signature"][3:]},
            BODY,
            401,
            "no valid",
        ),
        (signed(NOW - 301), BODY, 401, "too far from now"),  # stale
        (signed(NOW + 301), BODY, 401, "too far from now"),  # from the future
        ({k: v for k, v in signed().items() if k != "webhook-signature"}, BODY, 400, "missing"),
        ({**signed(), "webhook-timestamp": "1e9"}, BODY, 400, "not a number"),
    ],
)
def test_forged_altered_stale_or_incomplete_deliveries_are_refused(
    headers: dict[str, str], body: bytes, status: int, why: str
) -> None:
    with pytest.raises(rx.Refused) as e:
        rx.verify(SECRET, headers, body, now=NOW)
    assert e.value.status == status and why in e.value.reason


def test_one_valid_signature_among_several_is_enough() -> None:
    good = signed()["webhook-signature"]
    other = delivery_headers(b"o" * 32, MSG, NOW, BODY)["webhook-signature"]
    headers = {**signed(), "webhook-signature": f"{other} v1a,xyz {good}"}
    assert rx.verify(SECRET, headers, BODY, now=NOW) == (MSG, NOW)


def test_a_replay_is_refused_and_a_resend_is_taken_once() -> None:
    inbox = rx.Inbox()
    assert inbox.admit(MSG, NOW, now=NOW) is True
    with pytest.raises(rx.Refused, match="replayed"):
        inbox.admit(MSG, NOW, now=NOW + 5)  # the same signed message again
    assert inbox.admit(MSG, NOW + 60, now=NOW + 60) is False  # sent again: not handled twice


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    handled: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), rx.make_handler(SECRET, rx.Inbox(), handled.append)
    )
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", handled
    server.shutdown()
    server.server_close()


def test_the_example_takes_what_the_deliverer_sends_once_and_refuses_a_replay(
    receiver: tuple[str, list[dict[str, Any]]],
) -> None:
    url, handled = receiver
    job = Job(0, 1, MSG, "acme:s1", "run.started", BODY)
    policy = AddressPolicy(allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))

    async def send_twice() -> list[bool]:
        sender = Sender(policy, 5.0)
        try:
            out = [await sender(Target("wh_1", url, KEY), job)]
            await asyncio.sleep(1.1)  # a new second: a new timestamp, a new signature
            out.append((await sender(Target("wh_1", url, KEY), job)).ok)
            return [out[0].ok, out[1]]  # type: ignore[union-attr]
        finally:
            await sender.aclose()

    assert asyncio.run(send_twice()) == [True, True]  # a resend is answered 200 ...
    assert handled == [json.loads(BODY)]  # ... and handled once
    now = int(time.time())
    captured = delivery_headers(KEY, "acme:s1/r/0000000002", now, BODY)
    first = httpx.post(url, content=BODY, headers=captured)
    replay = httpx.post(url, content=BODY, headers=captured)
    forged = httpx.post(url, content=BODY, headers=delivery_headers(b"f" * 32, MSG, now, BODY))
    assert (first.status_code, replay.status_code, forged.status_code) == (200, 401, 401)
    assert replay.text == "replayed message" and forged.text == "no valid signature"
    assert len(handled) == 2
