"""One attempt over HTTP against a local server: what counts as delivered, what is tried
again, what is final, and that the request is signed and bounded."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sessionstream.runtimes.webhooks.dispatch import Job, Outcome, Target
from sessionstream.runtimes.webhooks.guard import AddressPolicy
from sessionstream.runtimes.webhooks.sender import Sender, retry_after_s
from sessionstream.runtimes.webhooks.signing import new_secret, secret_bytes, sign

LOOPBACK = AddressPolicy(allow_networks=(ipaddress.ip_network("127.0.0.1/32"),))
SECRET = new_secret()
JOB = Job(0, 7, "acme:s1/r/0000000001", "acme:s1", "run.started", b'{"seq":1}')

#: (status, headers, body, delay) by path
Answer = Callable[[str], tuple[int, dict[str, str], bytes, float]]


@pytest.fixture
def server() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
            status, headers, out, delay = ANSWERS[self.path.split("?")[0]]
            time.sleep(delay)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the sender hung up on the huge answer: as it should

    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv.server_address[1], seen
    srv.shutdown()
    srv.server_close()


ANSWERS: dict[str, tuple[int, dict[str, str], bytes, float]] = {
    "/ok": (204, {}, b"", 0),
    "/fail": (500, {}, b"database is down\r\nFAKE LOG LINE\x1b[31m" + b"x" * 5000, 0),
    "/gone": (410, {}, b"", 0),
    "/moved": (301, {"location": "http://169.254.169.254/"}, b"", 0),
    "/busy": (429, {"retry-after": "7"}, b"", 0),
    "/slow": (200, {}, b"", 1.5),
    "/huge": (200, {}, b"y" * (1 << 20), 0),
}


def _send(port: int, path: str, policy: AddressPolicy = LOOPBACK, timeout: float = 1.0) -> Outcome:
    async def go() -> Outcome:
        sender = Sender(policy, timeout, clock=lambda: 1767225600.0)
        try:
            return await sender(
                Target("wh_1", f"http://127.0.0.1:{port}{path}", secret_bytes(SECRET)), JOB
            )
        finally:
            await sender.aclose()

    return asyncio.run(go())


def test_a_2xx_is_delivered_and_the_request_is_signed(server: tuple[int, list[Any]]) -> None:
    port, seen = server
    assert _send(port, "/ok") == Outcome(True, 204)
    (req,) = seen
    h = {k.lower(): v for k, v in req["headers"].items()}
    assert req["body"] == JOB.body
    assert h["webhook-id"] == JOB.event_id and h["webhook-timestamp"] == "1767225600"
    assert h["webhook-signature"] == sign(secret_bytes(SECRET), JOB.event_id, 1767225600, JOB.body)
    assert h["content-type"] == "application/json"


def test_failures_say_why_and_are_retried(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    out = _send(port, "/fail")
    assert (out.ok, out.status, out.final) == (False, 500, False)
    assert out.error.startswith("HTTP 500: database is down  FAKE LOG LINE [31m")
    assert len(out.error) < 400 and out.error.isprintable()
    busy = _send(port, "/busy")
    assert (busy.status, busy.retry_after) == (429, 7.0)


def test_a_redirect_is_a_failure_and_is_not_followed(server: tuple[int, list[Any]]) -> None:
    port, seen = server
    out = _send(port, "/moved")
    assert (out.ok, out.status) == (False, 301) and len(seen) == 1


def test_410_gone_is_final(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    out = _send(port, "/gone")
    assert (out.ok, out.status, out.final) == (False, 410, True)


def test_an_answer_slower_than_the_timeout_fails(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    started = time.monotonic()
    out = _send(port, "/slow", timeout=0.3)
    assert not out.ok and "within 0.3s" in out.error
    assert time.monotonic() - started < 1.0


def test_a_large_answer_is_not_read_whole(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    assert _send(port, "/huge").ok


def test_a_refused_connection_is_retried() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    out = _send(port, "/ok")
    assert not out.ok and not out.final and "ConnectError" in out.error


def test_loopback_without_the_setting_is_final_and_nothing_is_sent(
    server: tuple[int, list[Any]],
) -> None:
    port, seen = server
    out = _send(port, "/ok", policy=AddressPolicy())
    assert (out.ok, out.final) == (False, True)
    assert out.error.startswith("refused: 127.0.0.1 is loopback") and seen == []


def test_retry_after_as_seconds_or_a_date() -> None:
    now = 1767225600.0
    assert retry_after_s("120", now) == 120.0
    assert retry_after_s("Thu, 01 Jan 2026 00:01:00 GMT", now) == 60.0
    assert retry_after_s("soon", now) is None and retry_after_s(None, now) is None


def test_a_host_that_does_not_resolve_now_is_retried() -> None:
    async def go() -> Outcome:
        sender = Sender(LOOPBACK, 1.0)
        try:
            target = Target("wh_1", "http://no-such-host.invalid/", secret_bytes(SECRET))
            return await sender(target, JOB)
        finally:
            await sender.aclose()

    out = asyncio.run(go())
    assert (out.ok, out.final) == (False, False) and "does not resolve" in out.error
