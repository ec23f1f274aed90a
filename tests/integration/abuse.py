"""What an attacker does to the gateway, as functions the abuse tests and the abuse
benchmark share (`tests/integration/apps/gateway/test_gateway_abuse.py`,
`bench/bench_gateway_abuse.py`). Every target is the loopback gateway of a test world; every
attempt is bounded in count and time.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from sessionstream.core.partitioning import partition_for

__all__ = [
    "fds",
    "fill_session",
    "first_event_s",
    "id_on_partition_of",
    "raw_request",
    "rss_mb",
    "stalled_streams",
]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def id_on_partition_of(other_full: str, tenant: str, partitions: int) -> str:
    """An own id of `tenant` whose full id hashes to the partition of `other_full`: the
    worst case, its catch-up scans past everything of the other session."""
    want = partition_for(other_full.encode(), partitions)
    while True:
        local = f"a-{uuid.uuid4().hex[:8]}"
        if partition_for(f"{tenant}:{local}".encode(), partitions) == want:
            return local


def fill_session(
    c: httpx.Client, sid: str, *, cycles: int = 20, big: int = 240_000, small: int = 400
) -> int:
    """`cycles` runs started with a `big`-character prompt and aborted with a `big`
    reason, then `small` tiny commands (rejections): the session's log is what a
    resumed stream of it must read. Returns the commands answered."""
    answered = 0
    text = "p" * big
    for i in range(cycles):
        r = c.post(
            f"/v1/sessions/{sid}/commands", json={"type": "prompt", "payload": {"text": text}}
        )
        assert r.status_code == 200, r.text[:300]
        r = c.post(
            f"/v1/sessions/{sid}/commands",
            json={"type": "abort", "payload": {"reason": f"{i}" + "r" * big}},
        )
        assert r.status_code == 200, r.text[:300]
        answered += 2
    for _ in range(small):
        r = c.post(f"/v1/sessions/{sid}/commands", json={"type": "abort"})
        assert r.status_code == 409, r.text[:300]
        answered += 1
    return answered


def raw_request(host: str, port: int, head: bytes, *, source: str = "127.0.0.1") -> socket.socket:
    """A socket from `source` (any 127.0.0.0/8 address) that has sent `head`."""
    sock = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
    if head:
        sock.sendall(head)
    return sock


def sse_head(host: str, port: int, sid: str, key: str, last_id: int | None) -> bytes:
    lines = [
        f"GET /v1/sessions/{sid}/events HTTP/1.1",
        f"Host: {host}:{port}",
        f"Authorization: Bearer {key}",
        "Accept: text/event-stream",
    ]
    if last_id is not None:
        lines.append(f"Last-Event-ID: {last_id}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@contextmanager
def stalled_streams(
    host: str, port: int, sid: str, key: str, n: int, *, last_id: int = -1
) -> Iterator[list[socket.socket]]:
    """`n` event streams of `sid` that resume from `last_id` and never read a byte (a
    small receive buffer, so the gateway's writes to them fill up soon)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(10)
            s.connect((host, port))
            s.sendall(sse_head(host, port, sid, key, last_id))
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def first_event_s(url: str, key: str, sid: str, last_id: int, timeout: float = 30) -> float:
    """Seconds from asking to resume `sid` after `last_id` to its first event."""
    started = time.monotonic()
    with (
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout
        ) as c,
        c.stream("GET", f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": str(last_id)}) as r,
    ):
        assert r.status_code == 200, r.read()[:300]
        for line in r.iter_lines():
            if line.startswith("data:"):
                return time.monotonic() - started
    raise AssertionError(f"the stream of {sid} ended without an event")
