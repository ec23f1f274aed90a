"""What the webhook tests drive: a receiver on 127.0.0.1 whose answers a test scripts (and
which can go down and come back on its port), events written to an isolated world's
events topic as the processor writes them, and subscriptions made as the CLI makes them."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from confluent_kafka import Producer
from pydantic import SecretStr

from sessionstream.adapters.kafka import client_config
from sessionstream.adapters.registry import reader_codec
from sessionstream.core.partitioning import partition_for
from sessionstream.runtimes.webhooks.admission import events_ends
from sessionstream.runtimes.webhooks.deliverer import sealer_of
from sessionstream.runtimes.webhooks.store import Subscription, create_subscription
from sessionstream.schemas.events import Event, Progress, RunFinished, RunStarted
from sessionstream.settings import Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def webhook_settings(base: Settings, **overrides: Any) -> Settings:
    """`base` (an isolated world) with a key, a group of its own, a receiver on loopback
    allowed and short back-offs."""
    values: dict[str, Any] = {
        "webhooks_secret_key": SecretStr(base64.b64encode(secrets.token_bytes(32)).decode()),
        # deleted with the world's groups (stack/worlds.py)
        "webhooks_group": f"{base.processor_group}-webhooks",
        "webhooks_allow_networks": "127.0.0.1/32",
        "webhooks_backoff_s": 0.2,
        "webhooks_backoff_max_s": 1.0,
        "webhooks_max_attempts": 100,
        "webhooks_timeout_s": 2.0,
        "webhooks_refresh_ms": 50,
    }
    values.update(overrides)
    return base.model_copy(update=values)


@dataclass
class Delivery:
    """One request the receiver got, and what it answered."""

    msg_id: str
    timestamp: int
    signature: str
    body: bytes
    status: int = 0
    at: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    #: the script made the deliverer wait past its timeout: whatever it answered came late
    late: bool = False

    @property
    def event(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.body)
        return out


#: a receiver's script: the delivery and how many times its id came before -> the status
#: to answer (it may sleep first, to time out)
Script = Callable[[Delivery, int], int]


def always_ok(_d: Delivery, _n: int) -> int:
    return 200


@dataclass
class Receiver:
    """An HTTP receiver on 127.0.0.1:`port`, recording every request it gets."""

    port: int = field(default_factory=free_port)
    script: Script = always_ok
    got: list[Delivery] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                d = Delivery(
                    self.headers.get("webhook-id", ""),
                    int(self.headers.get("webhook-timestamp") or 0),
                    self.headers.get("webhook-signature", ""),
                    body,
                    at=time.monotonic(),
                    headers={k.lower(): v for k, v in self.headers.items()},
                )
                with receiver._lock:
                    before = sum(1 for x in receiver.got if x.msg_id == d.msg_id)
                    receiver.got.append(d)
                d.status = receiver.script(d, before)
                with contextlib.suppress(OSError):  # the deliverer gave up waiting
                    self.send_response(d.status)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a deliverer killed or timing out mid-request: not the test's news

        self._server = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Down: the port refuses connections until `start` again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- what it got --------------------------------------------------------------------
    def accepted(self) -> list[Delivery]:
        """The deliveries it answered 2xx, in the order it got them."""
        with self._lock:
            return [d for d in self.got if 200 <= d.status < 300 and not d.late]

    def accepted_ids(self) -> list[str]:
        return [d.msg_id for d in self.accepted()]


def run_events(tenant: str, session: str, runs: int, per_run: int) -> list[Event]:
    """`runs` runs of `per_run` events each (run.started, tool.started..., run.finished),
    one after the other, as a session's log holds them."""
    out = []
    sid = f"{tenant}:{session}"
    for r in range(runs):
        run_id = str(uuid.uuid4())
        for seq in range(1, per_run + 1):
            if seq == 1:
                kind, payload = (
                    "run.started",
                    RunStarted(
                        prompt=f"p{r}", origin="prompt", source_command_id="c", timeout_at=9
                    ),
                )
            elif seq == per_run:
                kind, payload = (
                    "run.finished",
                    RunFinished(terminal_status="completed", result="ok"),
                )
            else:
                kind, payload = "tool.started", Progress(worker_id="w", name=f"t{seq}")
            out.append(
                Event(
                    session_id=sid,
                    run_id=run_id,
                    seq=seq,
                    type=kind,
                    payload=payload,
                    generation=1,
                    command_id=f"c-{r}-{seq}",
                    ts=int(time.time() * 1000),
                    tenant_id=tenant,
                )
            )
    return out


def write_events(settings: Settings, events: list[Event]) -> None:
    """Append `events` to the events topic, each on its session's partition."""
    codec = reader_codec(settings)
    producer = Producer(client_config(settings, **{"linger.ms": 5}))
    for e in events:
        producer.produce(
            settings.events_topic,
            key=e.key.encode(),
            value=codec.encode_event(e),
            partition=partition_for(e.session_id.encode(), settings.partitions),
        )
    assert producer.flush(30) == 0


def subscribe(
    settings: Settings, tenant: str, url: str, types: list[str] | None = None
) -> tuple[str, Subscription]:
    """A subscription made as `sessionstream webhooks create` makes it (the URL is not
    checked here: the tests of the guard do that)."""
    with psycopg.connect(
        settings.database_url, options=f"-c search_path={settings.database_schema}"
    ) as conn:
        return create_subscription(
            conn, sealer_of(settings), tenant, url, types or ["*"], events_ends(settings)
        )


def dead_letters(settings: Settings) -> list[tuple[Any, ...]]:
    with psycopg.connect(
        settings.database_url, options=f"-c search_path={settings.database_schema}"
    ) as conn:
        return conn.execute(
            "select subscription_id, event_id, partition, kafka_offset, attempts, last_status,"
            " last_error from webhook_dead_letters order by partition, kafka_offset"
        ).fetchall()


def keys_by_session(events: list[Event]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in events:
        out.setdefault(e.session_id, []).append(e.key)
    return out


def first_seen_order(ids: list[str]) -> dict[str, list[str]]:
    """Per session (the key's first part), the ids in the order they were first seen."""
    seen: set[str] = set()
    out: dict[str, list[str]] = {}
    for i in ids:
        if i not in seen:
            seen.add(i)
            out.setdefault(i.split("/")[0], []).append(i)
    return out


@contextlib.contextmanager
def receiving(script: Script = always_ok) -> Iterator[Receiver]:
    r = Receiver(script=script).start()
    try:
        yield r
    finally:
        r.stop()
