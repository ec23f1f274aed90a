"""A webhook receiver for sessionstream, with the Python standard library only.

It verifies each delivery as the Standard Webhooks specification says, then handles each
event once:

- the three headers must be there; ``webhook-timestamp`` must be within five minutes of
  this machine's clock (an old request captured and sent again is refused);
- ``webhook-signature`` holds one or more ``v1,<base64>`` signatures (space-separated);
  one must equal HMAC-SHA256(secret, ``{webhook-id}.{webhook-timestamp}.{raw body}``),
  compared in constant time, over the body's bytes as they came (never re-serialised);
- the same signed message twice (same id and timestamp) is a replay: refused;
- an event it already handled (same ``webhook-id``, a new timestamp: sessionstream sends
  at least once, so after a crash or a lost answer it sends again) is answered 200 and
  not handled again. This example remembers ids in memory; a real receiver records them
  with what it does, in the same transaction.

Run it::

    WEBHOOK_SECRET=whsec_... python webhook_receiver.py 9000

and subscribe ``http://<host>:9000/`` (docs/webhooks.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOLERANCE_S = 5 * 60
MAX_BODY = 1 << 20


class Refused(Exception):
    """A delivery this receiver does not accept: `status` is what it answers."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float | None = None,
    tolerance_s: float = TOLERANCE_S,
) -> tuple[str, int]:
    """The delivery's (webhook-id, webhook-timestamp) if it is signed with `secret`
    (``whsec_...``) and recent; `Refused` otherwise. `headers` are looked up lower-case."""
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the secret is whsec_ and base64") from None
    msg_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        raise Refused(400, "missing webhook-id, webhook-timestamp or webhook-signature")
    if not stamp.isdigit():
        raise Refused(400, "webhook-timestamp is not a number of seconds")
    ts = int(stamp)
    now = time.time() if now is None else now
    if abs(now - ts) > tolerance_s:
        raise Refused(401, "webhook-timestamp is too far from now (stale or replayed)")
    signed = f"{msg_id}.{ts}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return msg_id, ts
    raise Refused(401, "no valid signature")


class Inbox:
    """Which events were handled, and which signed messages were seen (for replays)."""

    def __init__(self, tolerance_s: float = TOLERANCE_S) -> None:
        self.tolerance_s = tolerance_s
        self.handled: set[str] = set()
        self._seen: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def admit(self, msg_id: str, ts: int, now: float | None = None) -> bool:
        """True: a new event, to handle now; False: handled before (answer 200 anyway).
        `Refused` for a signed message seen before (a replay)."""
        now = time.time() if now is None else now
        with self._lock:
            # a message older than the tolerance is refused by `verify`: forget it
            for k in [k for k, t in self._seen.items() if t < now - 2 * self.tolerance_s]:
                del self._seen[k]
            if (msg_id, ts) in self._seen:
                raise Refused(401, "replayed message")
            self._seen[(msg_id, ts)] = now
            if msg_id in self.handled:
                return False
            self.handled.add(msg_id)
            return True


def handle(event: dict[str, Any]) -> None:
    """What the receiver does with an event: here, print it."""
    print(
        f"{event['type']} session={event['sessionId']} run={event['runId']} seq={event['seq']}",
        flush=True,
    )


def make_handler(
    secret: str, inbox: Inbox, on_event: Callable[[dict[str, Any]], None] = handle
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY:
                self._answer(413, "too large")
                return
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                msg_id, ts = verify(secret, headers, body)
                if inbox.admit(msg_id, ts):
                    on_event(json.loads(body))
            except Refused as e:
                self._answer(e.status, e.reason)
                return
            self._answer(200, "ok")

        def _answer(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per event is printed by `handle`

    return Handler


def main() -> None:
    secret = os.environ["WEBHOOK_SECRET"].strip()
    try:
        base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        sys.exit("WEBHOOK_SECRET is not a whsec_... secret")
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(secret, Inbox()))
    print(f"listening on http://127.0.0.1:{port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
