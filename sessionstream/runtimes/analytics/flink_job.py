"""Flink SQL over the run event stream: the queries in `flink/*.sql` on PyFlink in
local mode, read_committed, as one job.

Runs with the Flink virtualenv's Python (`stack/flink/install.sh`), not the project's, and
imports nothing of sessionstream (that venv does not have it): the connection comes from
the same ``SESSIONSTREAM_*`` variables the other processes read, or from the flags.

    $FLINK_PYTHON sessionstream/runtimes/analytics/flink_job.py --bounded     # to the end, exit
    $FLINK_PYTHON sessionstream/runtimes/analytics/flink_job.py               # continuously
    (FLINK_PYTHON: `stack/flink/install.sh where`; `sessionstream flink-sql` runs it for you)

Each result row is one JSON line on stdout, ``{"query": ..., "op": "+I", "row": {...}}``
(`op` is Flink's change kind: a continuous run also retracts and updates earlier rows).
A record the job cannot decode (a schema id the registry lacks, a record not in the
Confluent framing) stops the job: exit status 1 and ``flink_job: stopped: <reason>`` on
stderr. It is never skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from string import Template
from typing import Any

__all__ = ["QUERIES", "SQL_DIR", "main", "render_source"]

SQL_DIR = Path(__file__).resolve().parent / "flink"
#: the queries, in output order (each `flink/<name>.sql` is one SELECT)
QUERIES = (
    "runs_by_status_per_minute",
    "run_status_totals",
    "run_duration_percentiles",
    "cancel_latency_percentiles",
    "rejections_by_reason",
    "active_runs_over_time",
)
_JARS = ("flink-sql-connector-kafka-5.0.0-2.2.jar", "flink-sql-avro-confluent-registry-2.2.0.jar")


def _env(name: str, default: str) -> str:
    return os.environ.get(f"SESSIONSTREAM_{name}", default)


def _default_jar_dir() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    home = os.environ.get("SESSIONSTREAM_FLINK_HOME") or str(Path(data) / "sessionstream" / "flink")
    return Path(home) / "jars"


def render_source(
    *,
    bootstrap: str,
    topic: str,
    registry_url: str,
    group_id: str,
    bounded: bool,
    start_offsets: str | None = None,
) -> str:
    """`flink/source.sql` with the connection filled in. `start_offsets`: `P:O,P:O,...`
    (every partition), where to start instead of the earliest offsets."""
    if start_offsets:
        pairs = [part.split(":") for part in start_offsets.split(",")]
        spec = ";".join(f"partition:{int(p)},offset:{int(o)}" for p, o in pairs)
        startup = (
            f"'scan.startup.mode' = 'specific-offsets', 'scan.startup.specific-offsets' = '{spec}',"
        )
    else:
        startup = "'scan.startup.mode' = 'earliest-offset',"
    return Template((SQL_DIR / "source.sql").read_text()).substitute(
        bootstrap=bootstrap,
        topic=topic,
        registry_url=registry_url,
        group_id=group_id,
        startup=startup,
        bounded="'scan.bounded.mode' = 'latest-offset'," if bounded else "",
        watermark_delay_s="5",
        idle_timeout_s="10",
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="flink_job", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--bounded",
        action="store_true",
        help="read to the end offsets at start, print the results, exit",
    )
    ap.add_argument(
        "--query",
        action="append",
        choices=QUERIES,
        help="run only this query (repeatable; default: all)",
    )
    ap.add_argument("--bootstrap", default=_env("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--topic", default=_env("EVENTS_TOPIC", "session.events"))
    ap.add_argument(
        "--registry-url",
        default=_env("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7"),
    )
    ap.add_argument(
        "--group-id", default=None, help="consumer group for offset commits (default: a fresh one)"
    )
    ap.add_argument(
        "--start-offsets",
        default=None,
        help="P:O,P:O,... for every partition: start there instead of the earliest offsets"
        " (sessionstream flink-sql passes where the registry framing starts)",
    )
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument(
        "--jars",
        default=os.environ.get("SESSIONSTREAM_FLINK_JARS"),
        help="';'-separated connector jars (default: the install.sh cache)",
    )
    return ap.parse_args(argv)


def _jar_urls(arg: str | None) -> str:
    paths = [Path(p) for p in arg.split(";")] if arg else [_default_jar_dir() / j for j in _JARS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"flink_job: missing jars {missing}; run stack/flink/install.sh")
    return ";".join(p.resolve().as_uri() for p in paths)


def _json_select(t_env: Any, name: str) -> str:
    """`SELECT '<name>', JSON_OBJECT(<every column>)` over the view `name`: one shape for
    every query, so all of them run as one job (one scan of the topic, reused)."""
    schema = t_env.from_path(name).get_schema()
    pairs = []
    for col, dtype in zip(schema.get_field_names(), schema.get_field_data_types(), strict=True):
        value = f"`{col}`"
        if "TIMESTAMP" in str(dtype).upper() or "LocalZoned" in type(dtype).__name__:
            # epoch milliseconds: no time-zone text to parse on the other side
            value = f"UNIX_TIMESTAMP(CAST(`{col}` AS STRING)) * 1000"
        pairs.append(f"KEY '{col}' VALUE {value}")
    return f"SELECT '{name}' AS q, JSON_OBJECT({', '.join(pairs)}) AS j FROM `{name}`"


def _root_causes(e: BaseException) -> str:
    """The Java exception chain's messages, outermost first, without stack frames."""
    text = str(e)
    java = getattr(e, "java_exception", None)
    if java is not None:
        text = str(java.toString())
        cause = java.getCause()
        while cause is not None:
            text += "\nCaused by: " + str(cause.toString())
            cause = cause.getCause()
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("at ")
    ]
    causes = [ln for ln in lines if ln.startswith("Caused by:")]
    # the innermost few carry the reason (e.g. the registry's "Schema not found")
    return "\n".join((lines[:1] + causes[-4:]) if causes else lines[:5])


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from pyflink.table import (  # type: ignore[import-not-found]
        EnvironmentSettings,
        TableEnvironment,
    )

    settings = (
        EnvironmentSettings.in_batch_mode()
        if args.bounded
        else EnvironmentSettings.in_streaming_mode()
    )
    t_env = TableEnvironment.create(settings)
    conf = t_env.get_config()
    for key, value in {
        "pipeline.jars": _jar_urls(args.jars),
        "pipeline.name": "sessionstream-flink-sql",
        "parallelism.default": str(args.parallelism),
        # loopback only; a free port (two jobs on one machine must not collide)
        "rest.bind-address": "127.0.0.1",
        "rest.address": "127.0.0.1",
        "rest.port": "0",
        "table.local-time-zone": "UTC",
        # the Kafka admin client logs from a thread after the job's class loader closed
        "classloader.check-leaked-classloader": "false",
    }.items():
        conf.set(key, value)
    queries = tuple(args.query or QUERIES)
    group = args.group_id or f"sessionstream-flink-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    rows = 0
    result = None
    try:
        t_env.execute_sql(
            render_source(
                bootstrap=args.bootstrap,
                topic=args.topic,
                registry_url=args.registry_url,
                group_id=group,
                bounded=args.bounded,
                start_offsets=args.start_offsets,
            )
        )
        for name in queries:
            try:
                t_env.execute_sql(
                    f"CREATE TEMPORARY VIEW `{name}` AS {(SQL_DIR / f'{name}.sql').read_text()}"
                )
            except Exception as e:
                raise RuntimeError(f"{name}.sql: {_root_causes(e)}") from e
        union = " UNION ALL ".join(_json_select(t_env, n) for n in queries)
        result = t_env.execute_sql(union)
        if not args.bounded:
            signal.signal(signal.SIGTERM, _interrupt)
        with result.collect() as it:
            for r in it:
                op = r.get_row_kind().name
                out = {"query": r[0], "op": _OPS.get(op, op), "row": json.loads(r[1])}
                print(json.dumps(out, sort_keys=True), flush=True)
                rows += 1
    except KeyboardInterrupt:
        # Ctrl-C / SIGTERM reach the gateway JVM too (same process group): py4j's errors
        # about the vanished JVM are noise here, the stop itself is the outcome.
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        try:
            client = result.get_job_client() if result is not None else None
            if client is not None:
                client.cancel()
        except Exception:  # the JVM already went with the signal
            pass
        print(f"flink_job: stopped by signal after {rows} rows", file=sys.stderr)
        return 0
    except Exception as e:  # any failure of the job is reported, then exit 1
        print(f"flink_job: stopped: {_root_causes(e)}", file=sys.stderr, flush=True)
        return 1
    print(
        f"flink_job: {rows} rows from {len(queries)} queries in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


_OPS = {"INSERT": "+I", "UPDATE_BEFORE": "-U", "UPDATE_AFTER": "+U", "DELETE": "-D"}

if __name__ == "__main__":
    sys.exit(main())
