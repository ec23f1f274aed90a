"""Logging set-up for the long-running processes: plain text or one JSON object a line."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

__all__ = ["RedactKeys", "setup_logging"]

#: an API key (sessionstream.apps.gateway.keys): its id may be logged, its secret never
_KEY = re.compile(r"(ssk_[0-9a-f]{12}_)[A-Za-z0-9_-]+")


class RedactKeys(logging.Filter):
    """Replaces the secret of any API key in a record's message with ``***`` (a key in a
    URL, a header echoed in an error: whatever path it took into a log line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "ssk_" in msg:
            redacted = _KEY.sub(r"\1***", msg)
            if redacted != msg:
                record.msg, record.args = redacted, None
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str = "INFO", json_logs: bool = False) -> None:
    """Configure the root logger once for a process."""
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactKeys())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # librdkafka's lines follow the process's level (short CLI commands silence them)
    logging.getLogger("sessionstream.adapters.kafka").setLevel(logging.NOTSET)
    # one INFO line per HTTP request of the registry client (httpx, and the copy the
    # schema registry client ships as httpx2): only their warnings
    for name in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
