"""`sessionstream worker`: run a Worker until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys

from sessionstream.errors import ConfigurationError, SessionstreamError
from sessionstream.runtimes.worker._handler import Handler, check_handler
from sessionstream.runtimes.worker.model import Model
from sessionstream.runtimes.worker.openai_model import OpenAIChatModel
from sessionstream.runtimes.worker.runtime import Worker
from sessionstream.settings import Settings

__all__ = ["load_handler", "model_from_settings", "run_worker"]

log = logging.getLogger("sessionstream.worker")


def load_handler(agent: str) -> Handler:
    """`reference`, or `package.module:function` naming an `async def run(ctx)`; anything
    else is a ConfigurationError saying why, before the worker takes any run."""
    if agent == "reference":
        from sessionstream.runtimes.worker.reference_agent import reference_agent

        return reference_agent
    module, _, name = agent.partition(":")
    if not name:
        raise ConfigurationError(f"agent {agent!r}: expected 'reference' or 'module:function'")
    # the current directory first, as uvicorn and gunicorn look for an app: an agent in
    # the project the worker is started from is found without installing it
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ConfigurationError(
            f"agent {agent!r}: cannot import {module!r} from {here} or the environment ({e})"
        ) from e
    if not hasattr(loaded, name):
        raise ConfigurationError(f"agent {agent!r}: module {module!r} has no {name!r}")
    return check_handler(getattr(loaded, name), agent)


def model_from_settings(settings: Settings) -> Model | None:
    """The configured model API (SESSIONSTREAM_MODEL_BASE_URL), or None for the FakeModel."""
    if not settings.model_base_url:
        return None
    model = OpenAIChatModel.from_settings(settings)
    log.info("model: %s at %s", model.name, model.base_url)
    return model


def run_worker(
    settings: Settings,
    agent: str,
    worker_id: str | None,
    lease_ms: int | None,
    capacity: int = 100,
) -> int:
    try:
        handler = load_handler(agent)
    except (ConfigurationError, ImportError, AttributeError) as e:
        log.error("%s", e)
        return 2

    if not _migrated(settings):
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        model = model_from_settings(settings)
        try:
            worker = Worker(
                settings, handler, worker_id, model=model, lease_ms=lease_ms, capacity=capacity
            )
            await worker.run(stop)
        finally:
            if isinstance(model, OpenAIChatModel):
                await model.aclose()

    try:
        asyncio.run(main())
    except SessionstreamError as e:
        log.error("%s", e)
        return 2
    return 0


def _migrated(settings: Settings, wait_s: float = 60.0) -> bool:
    """The action tables exist (migrations are idempotent and locked); a database that is
    still starting is waited for, as the sink does."""
    import time

    from sessionstream.adapters.postgres.migrate import migrate
    from sessionstream.errors import DatabaseUnavailable

    deadline = time.monotonic() + wait_s
    delay = 0.2
    while True:
        try:
            migrate(settings.database_conninfo, schema=settings.database_schema)
            return True
        except DatabaseUnavailable as e:
            if time.monotonic() > deadline:
                log.error("%s", e)
                return False
            reason = str(e).strip().splitlines()[0]
            log.warning("database unavailable (%s); retrying in %.1fs", reason, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
