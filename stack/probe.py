"""Readiness probes for Kafka and PostgreSQL, used by ``stack/stack.sh``.

"Answers" means a real protocol exchange, not an open port: Kafka must return cluster
metadata with at least one broker, PostgreSQL must run ``select 1`` with the configured
credentials, the schema registry must list its subjects (a JSON array). Run as
``python -m stack.probe``:

    config                        print the effective settings as shell assignments
    kafka BOOTSTRAP [--wait S] [--pid PID] [--credentials FILE] [--brokers N] [--node ID]
    postgres URL [--wait S] [--pid PID]
    registry URL [--wait S] [--pid PID] [--credentials FILE]   (the Confluent-compatible API)

``--credentials`` authenticates with the Kafka settings of a credentials file (the secured
stack's ``admin.env``): a broker that is up but refuses them does not answer. ``--brokers``
waits until the metadata lists at least N live brokers, ``--node`` until it lists broker ID
(a restarted cluster node counts once it has registered again).

Exit status: 0 answers (one descriptive line on stdout); 1 nothing listens; 2 something
listens but does not answer correctly (the reason on stderr); 3 the watched pid exited.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from sessionstream.errors import SessionstreamError

__all__ = [
    "NotAnswering",
    "NotListening",
    "is_local_kafka",
    "is_local_postgres",
    "kafka_answers",
    "postgres_answers",
    "registry_answers",
]

LOCAL_KAFKA = "127.0.0.1:9092"
LOCAL_PG = ("127.0.0.1", 5432)
LOCAL_REGISTRY = "http://127.0.0.1:8081/apis/ccompat/v7"
_LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", ""}


class NotListening(SessionstreamError):
    """No process accepts TCP connections on any of the addresses."""


class NotAnswering(SessionstreamError):
    """Something accepts connections but does not answer as the expected server."""


def _split_hostport(hostport: str, default_port: int) -> tuple[str, int]:
    host, sep, port = hostport.strip().rpartition(":")
    if not sep:
        return hostport.strip(), default_port
    return host.strip("[]"), int(port)


def _any_listening(addresses: list[tuple[str, int]]) -> bool:
    for host, port in addresses:
        try:
            with socket.create_connection((host or "127.0.0.1", port), timeout=1.0):
                return True
        except OSError:
            continue
    return False


def kafka_answers(
    bootstrap: str,
    timeout: float = 5.0,
    *,
    security: dict[str, str] | None = None,
    brokers: int = 1,
    node: int | None = None,
) -> str:
    """Describe the cluster behind ``bootstrap`` after a metadata request, or raise.

    ``security`` holds librdkafka's security properties (see `_kafka.security_config`)."""
    addresses = [_split_hostport(a, 9092) for a in bootstrap.split(",") if a.strip()]
    if not _any_listening(addresses):
        raise NotListening(f"nothing listens on {bootstrap}")
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # librdkafka logs every failed connection to stderr; the caller reports the outcome.
    quiet = logging.getLogger("sessionstream.probe.librdkafka")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})}, logger=quiet)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise NotAnswering(f"no Kafka metadata from {bootstrap}: {e.args[0]}") from e
    live = sorted(metadata.brokers)
    if len(live) < max(brokers, 1):
        raise NotAnswering(
            f"Kafka at {bootstrap} lists {len(live)} live broker(s) {live}, want {brokers}"
        )
    if node is not None and node not in metadata.brokers:
        raise NotAnswering(f"Kafka at {bootstrap} does not list broker {node} yet (live: {live})")
    if security:
        auth = f", as {security.get('sasl.username')} ({security.get('sasl.mechanism')})"
    else:
        auth = ""
    return f"cluster {metadata.cluster_id}, {len(live)} broker(s){auth}"


def registry_credentials(path: str) -> tuple[str, str] | None:
    """The registry's (user, password) of a credentials file, if it names them."""
    from sessionstream.settings import read_credentials_file

    values = read_credentials_file(path)
    user = values.get("schema_registry_username")
    return (user, values.get("schema_registry_password", "")) if user else None


def credentials_security(path: str) -> dict[str, str]:
    """librdkafka's security properties from a credentials file's Kafka settings."""
    from sessionstream.adapters.kafka import security_config
    from sessionstream.settings import Settings, read_credentials_file

    values = {k: v for k, v in read_credentials_file(path).items() if k.startswith("kafka_")}
    return security_config(Settings(**values))  # type: ignore[arg-type]


def postgres_answers(url: str, timeout: float = 5.0) -> str:
    """Describe the server behind ``url`` after ``select 1``, or raise."""
    import psycopg

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    if not host.startswith("/") and not _any_listening([(host, port)]):
        raise NotListening(f"nothing listens on {host}:{port}")
    try:
        with psycopg.connect(url, connect_timeout=max(1, int(timeout))) as conn:
            one = conn.execute("select 1").fetchone()
            version = conn.execute("show server_version").fetchone()
    except psycopg.Error as e:
        raise NotAnswering(f"PostgreSQL at {host}:{port}: {str(e).strip()}") from e
    if one != (1,) or version is None:
        raise NotAnswering(f"PostgreSQL at {host}:{port} answered select 1 with {one!r}")
    return f"PostgreSQL {version[0]}"


def registry_answers(url: str, timeout: float = 5.0, auth: tuple[str, str] | None = None) -> str:
    """Describe the schema registry behind ``url`` after listing its subjects, or raise."""
    import httpx

    parts = urlsplit(url)
    host, port = (
        parts.hostname or "127.0.0.1",
        parts.port or (443 if parts.scheme == "https" else 80),
    )
    if not _any_listening([(host, port)]):
        raise NotListening(f"nothing listens on {host}:{port}")
    try:
        r = httpx.get(f"{url.rstrip('/')}/subjects", timeout=timeout, auth=auth)
        subjects = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as e:
        raise NotAnswering(f"schema registry at {url}: {type(e).__name__}: {e}") from e
    if not isinstance(subjects, list):
        raise NotAnswering(f"schema registry at {url}: GET /subjects answered {r.status_code}")
    return f"schema registry, {len(subjects)} subject(s)"


def connect_answers(url: str, timeout: float = 5.0) -> str:
    """Describe the Kafka Connect worker behind ``url`` (its REST root), or raise."""
    import httpx

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if not _any_listening([(host, port)]):
        raise NotListening(f"nothing listens on {host}:{port}")
    try:
        r = httpx.get(f"{url.rstrip('/')}/", timeout=timeout)
        root = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as e:
        raise NotAnswering(f"Kafka Connect at {url}: {type(e).__name__}: {e}") from e
    if not isinstance(root, dict) or "version" not in root:
        raise NotAnswering(f"Kafka Connect at {url}: GET / answered {r.status_code}")
    try:
        plugins = httpx.get(f"{url.rstrip('/')}/connector-plugins", timeout=timeout).json()
    except (httpx.HTTPError, ValueError) as e:
        raise NotAnswering(f"Kafka Connect at {url}: its plugins: {e}") from e
    return f"Kafka Connect {root['version']}, {len(plugins)} connector plugin(s)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(probe: Callable[[], str], wait: float, pid: int | None) -> int:
    """Retry ``probe`` until it answers, the pid dies, or ``wait`` seconds pass."""
    deadline = time.monotonic() + wait
    while True:
        try:
            print(probe())
            return 0
        except NotListening as e:
            code, reason = 1, str(e)
        except NotAnswering as e:
            code, reason = 2, str(e)
        if pid is not None and not _pid_alive(pid):
            print(f"process {pid} exited; last probe: {reason}", file=sys.stderr)
            return 3
        if time.monotonic() >= deadline:
            print(reason, file=sys.stderr)
            return code
        time.sleep(0.25)


def is_local_kafka(bootstrap: str) -> bool:
    """Whether ``bootstrap`` is the address the local stack's broker listens on."""
    addresses = [_split_hostport(a, 9092) for a in bootstrap.split(",") if a.strip()]
    return all(h in _LOOPBACK_NAMES and p == 9092 for h, p in addresses)


def is_local_postgres(url: str) -> bool:
    """Whether ``url`` points at the port the local stack's PostgreSQL listens on."""
    parts = urlsplit(url)
    return (parts.hostname or "") in _LOOPBACK_NAMES and (parts.port or 5432) == LOCAL_PG[1]


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def _print_config() -> int:
    from sessionstream.settings import Settings

    s = Settings()
    values = {
        "CFG_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
        "CFG_KAFKA_LOCAL": "1" if is_local_kafka(s.kafka_bootstrap) else "0",
        "CFG_DATABASE_URL": s.database_url,
        "CFG_DATABASE_URL_SHOWN": _redacted(s.database_url),
        "CFG_PG_LOCAL": "1" if is_local_postgres(s.database_url) else "0",
        "CFG_REGISTRY_URL": s.schema_registry_url,
        "CFG_CONNECT_URL": s.connect_url,
        "CFG_REGISTRY_LOCAL": "1" if s.schema_registry_url.rstrip("/") == LOCAL_REGISTRY else "0",
    }
    for key, value in values.items():
        print(f"{key}={shlex.quote(value)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.probe")
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("config")
    for name, target in (
        ("kafka", "bootstrap"),
        ("postgres", "url"),
        ("registry", "url"),
        ("connect", "url"),
    ):
        p = sub.add_parser(name)
        p.add_argument(target)
        p.add_argument("--wait", type=float, default=0.0)
        p.add_argument("--pid", type=int, default=None)
        if name in ("kafka", "registry"):
            p.add_argument("--credentials", default=None)
        if name == "kafka":
            p.add_argument("--brokers", type=int, default=1)
            p.add_argument("--node", type=int, default=None)
    args = parser.parse_args(argv)
    if args.what == "config":
        return _print_config()
    if args.what == "kafka":
        bootstrap: str = args.bootstrap
        security = credentials_security(args.credentials) if args.credentials else None
        return _wait(
            lambda: kafka_answers(
                bootstrap, timeout=5.0, security=security, brokers=args.brokers, node=args.node
            ),
            args.wait,
            args.pid,
        )
    url: str = args.url
    if args.what == "registry":
        auth = registry_credentials(args.credentials) if args.credentials else None
        return _wait(lambda: registry_answers(url, timeout=5.0, auth=auth), args.wait, args.pid)
    if args.what == "connect":
        return _wait(lambda: connect_answers(url, timeout=5.0), args.wait, args.pid)
    return _wait(lambda: postgres_answers(url, timeout=5.0), args.wait, args.pid)


if __name__ == "__main__":
    sys.exit(main())
