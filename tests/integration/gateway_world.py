"""A gateway on an isolated world (its own topics and schema) with a real processor, sink
and, when asked, workers and the analytics app: what the gateway tests and the browser
test drive over HTTP."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg

from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.apps.gateway.keys import create_key
from sessionstream.settings import Settings
from stack.worlds import delete_groups
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc
from tests.integration.worlds import isolated_world


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class GatewayWorld:
    settings: Settings
    procs: list[Proc] = field(default_factory=list)
    gateway: Proc | None = None
    #: the isolated world's own cleanup (its schema), closed by `stop`
    world: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.gateway_port}"

    def conn(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(
            self.settings.database_url,
            options=f"-c search_path={self.settings.database_schema}",
        )

    def key(self, tenant: str, actor: str | None = None) -> str:
        with self.conn() as conn:
            key, _ = create_key(conn, tenant, actor)
        return key

    def client(self, key: str | None, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, **{"timeout": 30, **kw})

    def start(
        self, *, workers: int = 0, analytics: bool = False, gateway_args: tuple[str, ...] = ()
    ) -> GatewayWorld:
        s = self.settings
        migrate(s.database_conninfo, schema=s.database_schema)
        self.procs.append(Proc(s, "processor", "--instance", "gw0").start())
        self.procs.append(Proc(s, "sink").start())
        for i in range(workers):
            self.procs.append(
                Proc(s, "worker", "--worker-id", f"gw-worker-{i}", "--lease-ms", "3000").start()
            )
        if analytics:
            self.procs.append(Proc(s, "analytics").start())
        self.procs[0].wait_log("assigned", 90)
        self.procs[1].wait_log("assigned", 90)
        self.gateway = Proc(s, "gateway", *gateway_args).start()
        self.procs.append(self.gateway)
        self.gateway.wait_log("Uvicorn running on", 60)
        return self

    def stop(self) -> None:
        with self.world:
            for p in reversed(self.procs):
                p.stop()
            # the analytics app's own topics (faust's changelog and assignor topics)
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap})
            prefix = f"{self.settings.analytics_app_id}-"
            ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
            for fut in admin.delete_topics(ours, operation_timeout=30).values() if ours else []:
                fut.result(timeout=60)
            # and its consumer group (faust's consumer has stopped: the group is empty)
            delete_groups(admin, [self.settings.analytics_app_id])

    def sink_has(self, session_id: str, what: str) -> bool:
        with self.conn() as conn:
            row = conn.execute(
                "select count(*) from agent_run_events where session_id = %s and type = %s",
                (session_id, what),
            ).fetchone()
        return bool(row and row[0])

    def wait_sink(self, session_id: str, what: str, timeout: float = 30) -> None:
        wait_until(
            lambda: self.sink_has(session_id, what),
            timeout=timeout,
            what=f"{what} of {session_id} in PostgreSQL",
        )


def gateway_world(base: Settings, tag: str, **overrides: Any) -> GatewayWorld:
    """An `isolated_world` with ports and an analytics app of its own, and `overrides`;
    nothing started yet. `stop` ends it."""
    world = contextlib.ExitStack()
    s = world.enter_context(isolated_world(base, tag)).model_copy(
        update={
            "gateway_port": free_port(),
            "analytics_port": free_port(),
            "analytics_app_id": f"it-analytics-{tag}-{int(time.time() * 1000)}",
            **overrides,
        }
    )
    return GatewayWorld(s, world=world)


class SSE:
    """A minimal Server-Sent-Events reader over an httpx stream: (id, event, data) tuples."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.iter_lines()

    def __iter__(self) -> SSE:
        return self

    def __next__(self) -> tuple[str | None, str | None, Any]:
        eid: str | None = None
        event: str | None = None
        data: list[str] = []
        for line in self.lines:
            if line == "":
                if data:
                    return eid, event, json.loads("\n".join(data))
                eid, event, data = None, None, []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                eid = value
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)
        raise StopIteration
