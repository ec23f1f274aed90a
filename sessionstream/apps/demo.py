"""`sessionstream demo` (what `make demo` runs): the protocol, end to end, in about a minute.

Starts a processor, a sink, two workers running the reference agent, the live analytics
and the HTTP gateway with its web console (a demo API key for tenant `acme` is created and
the console's URL printed), then plays six scenes against real Kafka and PostgreSQL, and
ends with each run's timeline replayed from PostgreSQL and the audit.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sessionstream.adapters.kafka import OFFSET_END, TopicPartition, new_reader
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.adapters.topics import check_topics, ensure_topics
from sessionstream.apps._model_server import free_port
from sessionstream.apps._procs import Service
from sessionstream.apps.gateway.keys import create_key
from sessionstream.client import Outcome, SessionClient
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import Event, FollowUpDelivered
from sessionstream.settings import Settings

__all__ = ["run_demo"]

console = Console()
LEASE_MS = 3000


class Watch:
    """Every committed event, from the moment the demo starts, indexed by session."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.events: dict[str, list[Event]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        s = self.settings
        c = new_reader(s, group_id=f"demo-watch-{uuid.uuid4()}", fetch_wait_ms=20)
        parts = c.list_topics(s.events_topic, timeout=10).topics[s.events_topic].partitions
        c.assign([TopicPartition(s.events_topic, p, OFFSET_END) for p in parts])
        codec = reader_codec(s, stop=self.stop)
        self.ready.set()
        while not self.stop.is_set():
            msg = c.poll(0.1)
            if msg is None or msg.error() is not None or msg.value() is None:
                continue
            e = codec.decode_event(msg.value() or b"")
            with self.lock:
                self.events.setdefault(e.session_id, []).append(e)
        c.close()

    def of(self, session: str) -> list[Event]:
        with self.lock:
            return list(self.events.get(session, []))

    def wait(
        self, session: str, pred: Callable[[Event], bool], what: str, timeout: float = 60.0
    ) -> Event:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.of(session):
                if pred(e):
                    return e
            time.sleep(0.05)
        raise TimeoutError(f"demo: no {what} in session {session} within {timeout}s")


def _say(text: str) -> None:
    console.print(text, highlight=False)


def _event_line(e: Event) -> str:
    data = {k: v for k, v in Codec.event_to_json(e)["payload"].items() if v not in (None, [], "")}
    detail = ", ".join(f"{k}={v}" for k, v in data.items())
    return f"    [dim]{e.run_id[:8]} #{e.seq} gen {e.generation}[/dim] {e.type} {detail[:90]}"


def _outcome_line(who: str, o: Outcome) -> str:
    color = {"accepted": "green", "rejected": "red", "duplicate": "yellow", "dead_letter": "red"}[
        o.status
    ]
    what = f"run {o.run_id[:8]}" if o.run_id and o.status == "accepted" else (o.reason or "")
    kinds = ", ".join(e.type for e in o.events)
    return f"  {who}: [{color}]{o.status}[/{color}] {what} ({kinds})"


def _scene(n: int, title: str) -> None:
    console.rule(f"[bold]{n}. {title}")


def run_demo(settings: Settings, keep: bool = False) -> int:
    s = settings
    tag = uuid.uuid4().hex[:6]
    log_dir = Path(tempfile.mkdtemp(prefix="sessionstream-demo-"))
    console.rule("[bold]sessionstream demo")
    _say(
        f"Kafka {s.kafka_bootstrap}, PostgreSQL {s.database_url.split('@')[-1]}; logs in {log_dir}"
    )
    migrate(s.database_conninfo, schema=s.database_schema)
    ensure_topics(s)
    check_topics(s)
    # The workers stream their model calls from a local OpenAI-compatible server, unless
    # SESSIONSTREAM_MODEL_BASE_URL already names a provider.
    ws, local_model = s, None
    if not s.model_base_url:
        port = free_port()
        local_model = Service("model-server", s, ["model-server", "--port", str(port)], log_dir)
        ws = s.model_copy(update={"model_base_url": f"http://127.0.0.1:{port}/v1"})
    services = {
        "processor": Service("processor", s, ["processor", "--instance", "demo"], log_dir),
        "sink": Service("sink", s, ["sink"], log_dir),
        "worker-a": Service(
            "worker-a",
            ws,
            ["worker", "--worker-id", "worker-a", "--lease-ms", str(LEASE_MS)],
            log_dir,
        ),
        "worker-b": Service(
            "worker-b",
            ws,
            ["worker", "--worker-id", "worker-b", "--lease-ms", str(LEASE_MS)],
            log_dir,
        ),
    }
    if local_model is not None:
        services = {"model-server": local_model, **services}
    s, front = _front_door(s, log_dir)
    services.update(front)
    watch = Watch(s)
    runs: list[tuple[str, str]] = []
    console_url, key_id = "", ""
    try:
        for svc in services.values():
            svc.start()
        services["processor"].wait_for("assigned")
        services["sink"].wait_for("assigned")
        for w in ("worker-a", "worker-b"):
            services[w].wait_for("ready:")
        _say("started: processor (exactly-once), sink, worker-a, worker-b (reference agent)")
        if "gateway" in services:
            services["gateway"].wait_for("Uvicorn running on")
        console_url, key_id = _console_url(s)
        console.print(
            f"  web console (tenant acme; live timelines, stats): [bold]{console_url}[/bold]",
            soft_wrap=True,
            highlight=False,
        )
        if local_model is not None:
            local_model.wait_for("listening")
        _say(f"  model calls stream from {ws.model_base_url} ({ws.model_name})")
        watch.thread.start()
        watch.ready.wait(10)
        with SessionClient("acme", s) as ui, SessionClient("acme", s) as scheduler:
            runs += _scene_race(ui, scheduler, watch, tag)
            runs += _scene_cancel(ui, watch, tag)
            runs += _scene_takeover(ui, watch, services, tag)
            runs += _scene_timeout(ui, watch, tag)
        return _finale(s, runs, services)
    finally:
        watch.stop.set()
        if keep and key_id:
            console.print(f"web console: [bold]{console_url}[/bold]", soft_wrap=True)
        elif key_id:
            _revoke(s, key_id)  # its gateway stops now: the key goes with it
        if keep:
            _say(
                f"[bold]--keep:[/bold] processes still running (pids "
                f"{', '.join(f'{k}={v.pid}' for k, v in services.items() if v.alive())}); "
                f"logs in {log_dir}"
            )
        else:
            for svc in services.values():
                svc.stop()


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _front_door(s: Settings, log_dir: Path) -> tuple[Settings, dict[str, Service]]:
    """The live analytics and the gateway. An analytics app already answering on its port
    is used as it is; a gateway port in use is replaced by a free one."""
    services: dict[str, Service] = {}
    if _port_free(s.analytics_port):
        services["analytics"] = Service("analytics", s, ["analytics"], log_dir)
    else:
        _say(f"  analytics: port {s.analytics_port} in use; the gateway reads what answers there")
    if not _port_free(s.gateway_port):
        port = free_port()
        _say(f"  gateway: port {s.gateway_port} is in use; the demo's gateway listens on {port}")
        s = s.model_copy(update={"gateway_port": port})
    services["gateway"] = Service("gateway", s, ["gateway"], log_dir)
    return s, services


def _console_url(s: Settings) -> tuple[str, str]:
    """A key for tenant `acme` (the demo's sessions), in the console's URL's fragment:
    the console keeps it in the browser and drops it from the address bar."""
    from sessionstream.adapters.postgres import connect

    with connect(s) as conn:
        key, rec = create_key(conn, "acme", "demo", name="make demo")
    # in the fragment: a browser never sends it, so no server or proxy log holds the key
    return f"http://{s.gateway_host}:{s.gateway_port}/#key={key}", rec.key_id


def _revoke(s: Settings, key_id: str) -> None:
    from sessionstream.adapters.postgres import connect
    from sessionstream.apps.gateway.keys import revoke_key

    with connect(s) as conn:
        revoke_key(conn, key_id)


def _scene_race(
    ui: SessionClient, scheduler: SessionClient, watch: Watch, tag: str
) -> list[tuple[str, str]]:
    sid = ui.session_id(f"demo-{tag}-trip")
    _scene(1, "Two entry points hit one session at the same moment")
    _say(f"  the UI and the scheduler both send a prompt to session {sid}, concurrently")
    prompt = "plan a trip to Lisbon steps=3 tool_ms=1500 model_ms=100 email=end"
    handles = {}
    barrier = threading.Barrier(2)

    def send(name: str, client: SessionClient) -> None:
        barrier.wait()
        handles[name] = client.prompt(sid, prompt)

    threads = [
        threading.Thread(target=send, args=(n, c))
        for n, c in (("ui click", ui), ("scheduler", scheduler))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = {n: (ui if n == "ui click" else scheduler).wait(h, 30) for n, h in handles.items()}
    for name, o in outcomes.items():
        _say(_outcome_line(name, o))
    run = next(o.run_id for o in outcomes.values() if o.status == "accepted" and o.run_id)
    _say("  one run, one rejection (session_busy): the session has exactly one writer")
    later = scheduler.wait(
        scheduler.prompt(sid, "weekly report steps=1 tool_ms=200 email=no", policy="enqueue"), 30
    )
    _say(_outcome_line("scheduler retries with policy=enqueue", later))

    _scene(2, "Steer: change course mid-run")
    watch.wait(sid, lambda e: e.type == "run.lease_granted" and e.run_id == run, "lease")
    _say(_outcome_line("UI steer", ui.wait(ui.steer(sid, "skip flights, try trains"), 30)))
    e = watch.wait(
        sid,
        lambda e: (
            e.type == "model.request.started"
            and "trains" in (getattr(e.payload, "detail", "") or "")
        ),
        "a model call that saw the steer",
    )
    _say(f"  the worker's next model call carries it: {getattr(e.payload, 'detail', '')[:80]}")

    _scene(3, "Follow-up: extra information, delivered before the run finishes")
    _say(
        _outcome_line("UI follow-up", ui.wait(ui.follow_up(sid, "also check the last 7 days"), 30))
    )
    d = watch.wait(sid, lambda e: e.type == "run.follow_up_delivered", "follow-up delivery", 60)
    _say(f"  delivered to run {d.run_id[:8]}: {d.payload_as(FollowUpDelivered).text!r}")
    fin = watch.wait(sid, lambda e: e.type == "run.finished" and e.run_id == run, "run end", 60)
    _say(f"  run {run[:8]} finished: {getattr(fin.payload, 'terminal_status', '')}")
    nxt = watch.wait(sid, lambda e: e.type == "run.started" and e.run_id != run, "queued run", 30)
    _say(f"  then the scheduler's queued prompt started run {nxt.run_id[:8]}")
    watch.wait(sid, lambda e: e.type == "run.finished" and e.run_id == nxt.run_id, "end", 60)
    return [(sid, run), (sid, nxt.run_id)]


def _scene_cancel(ui: SessionClient, watch: Watch, tag: str) -> list[tuple[str, str]]:
    sid = ui.session_id(f"demo-{tag}-report")
    _scene(4, "Cancel during a tool call: nothing keeps running, no email")
    o = ui.wait(ui.prompt(sid, "compile the report steps=1 tool_ms=20000 email=end"), 30)
    _say(_outcome_line("UI prompt (tool takes 20 s, then emails the result)", o))
    assert o.run_id
    run = o.run_id
    watch.wait(sid, lambda e: e.type == "tool.started" and e.run_id == run, "tool start", 30)
    _say("  the tool is running; the user presses stop")
    t0 = time.monotonic()
    _say(_outcome_line("UI abort", ui.wait(ui.abort(sid), 30)))
    fin = watch.wait(sid, lambda e: e.type == "run.finished" and e.run_id == run, "cancel", 40)
    for e in watch.of(sid):
        if e.type in (
            "run.cancel_requested",
            "run.cancel_acknowledged",
            "tool.finished",
            "run.finished",
        ):
            _say(_event_line(e))
    _say(
        f"  cancelled {1000 * (time.monotonic() - t0):.0f} ms after the abort "
        f"({getattr(fin.payload, 'terminal_status', '')})"
    )
    asked = [e for e in watch.of(sid) if e.type.startswith("action.") and e.run_id == run]
    _say(
        f"  email actions asked for or approved in this run: {len(asked)} "
        "(the gate refuses any from now on; scene 7 counts the outbox)"
    )
    return [(sid, run)]


def _scene_takeover(
    ui: SessionClient, watch: Watch, services: dict[str, Service], tag: str
) -> list[tuple[str, str]]:
    sid = ui.session_id(f"demo-{tag}-batch")
    _scene(5, "A worker dies; another takes the run over with a new generation")
    o = ui.wait(ui.prompt(sid, "process the batch steps=4 tool_ms=800 email=end"), 30)
    assert o.run_id
    run = o.run_id
    g = watch.wait(sid, lambda e: e.type == "run.lease_granted" and e.run_id == run, "lease", 30)
    holder = getattr(g.payload, "worker_id", "")
    watch.wait(sid, lambda e: e.type == "tool.started" and e.run_id == run, "tool start", 30)
    _say(f"  {holder} holds generation {g.generation}; kill -9 {holder}")
    services[holder].kill9()
    exp = watch.wait(sid, lambda e: e.type == "run.lease_expired", "lease expiry", 30)
    _say(f"  lease expired (timer): generation bumped to {exp.generation}")
    g2 = watch.wait(
        sid, lambda e: e.type == "run.lease_granted" and e.generation > g.generation, "takeover", 30
    )
    _say(f"  {getattr(g2.payload, 'worker_id', '')} took over with generation {g2.generation}")
    fin = watch.wait(sid, lambda e: e.type == "run.finished" and e.run_id == run, "end", 60)
    _say(f"  finished {getattr(fin.payload, 'terminal_status', '')} by generation {fin.generation}")
    services[holder].start()  # back to two workers
    return [(sid, run)]


def _scene_timeout(ui: SessionClient, watch: Watch, tag: str) -> list[tuple[str, str]]:
    sid = ui.session_id(f"demo-{tag}-slow")
    _scene(6, "A run that outlives its deadline")
    o = ui.wait(ui.prompt(sid, "slow job steps=1 tool_ms=15000 email=end", timeout_ms=2500), 30)
    _say(_outcome_line("UI prompt with a 2.5 s deadline (its tool takes 15 s)", o))
    assert o.run_id
    fin = watch.wait(sid, lambda e: e.type == "run.finished" and e.run_id == o.run_id, "end", 30)
    _say(
        f"  the deadline timer ended it: {getattr(fin.payload, 'terminal_status', '')} "
        "(retryable, distinct from failed); the worker stopped the run"
    )
    return [(sid, o.run_id)]


def _finale(s: Settings, runs: list[tuple[str, str]], services: dict[str, Service]) -> int:
    from sessionstream.adapters.postgres import connect
    from sessionstream.runtimes.sink.audit import run_audit
    from sessionstream.runtimes.sink.replay import events_of_run

    _scene(7, "Replayed from PostgreSQL")
    with connect(s) as conn:
        deadline = time.monotonic() + 60
        for _sid, run in runs:
            while not any(e.type == "run.finished" for e in events_of_run(conn, run)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sink did not write run {run} within 60 s")
                time.sleep(0.2)
            events = events_of_run(conn, run)
            table = Table(title=f"run {run[:8]} ({events[0].session_id})", title_justify="left")
            for col in ("seq", "gen", "type", "detail"):
                table.add_column(col)
            for e in events:
                data = {
                    k: v
                    for k, v in Codec.event_to_json(e)["payload"].items()
                    if v not in (None, [], "") and k not in ("workerId", "callId")
                }
                table.add_row(
                    str(e.seq),
                    str(e.generation),
                    e.type,
                    ", ".join(f"{k}={v}" for k, v in data.items())[:70],
                )
            console.print(table)
        rows = conn.execute(
            "select run_id, count(*) from agent_outbox where run_id = any(%s) group by run_id",
            ([r for _s, r in runs],),
        ).fetchall()
        sent = {str(r): int(str(n)) for r, n in rows}
        _say(
            "emails in agent_outbox: "
            + ", ".join(f"{sid.split('-')[-1]} {run[:8]}: {sent.get(run, 0)}" for sid, run in runs)
        )
        _scene(8, "Audit")
        checks = run_audit(s, conn, policy=s.approval_kinds)
    for c in checks:
        mark = "[green]PASS[/green]" if c.ok else "[red]FAIL[/red]"
        _say(f"{mark} {c.number}. {c.title}")
        for line in c.evidence[:2]:
            _say(f"       [dim]{line}[/dim]")
    ok = all(c.ok for c in checks)
    console.rule("[bold green]demo complete" if ok else "[bold red]demo: audit failed")
    return 0 if ok else 1
