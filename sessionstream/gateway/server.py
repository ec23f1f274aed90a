"""Serve the gateway with uvicorn until SIGTERM/SIGINT."""

from __future__ import annotations

import logging

import uvicorn

from sessionstream.gateway.app import create_app
from sessionstream.settings import Settings

__all__ = ["run_gateway"]

log = logging.getLogger("sessionstream.gateway")


def run_gateway(settings: Settings, log_level: str = "INFO", access_log: bool = False) -> int:
    app = create_app(settings, settle_gc=True)
    log.info(
        "gateway on http://%s:%d/ (API /v1, OpenAPI /openapi.json)",
        settings.gateway_host,
        settings.gateway_port,
    )
    config = uvicorn.Config(
        app,
        host=settings.gateway_host,
        port=settings.gateway_port,
        log_level=log_level.lower(),
        access_log=access_log,
        loop="uvloop",
        http="httptools",
        # the lifespan starts the Kafka threads: a failure there must stop the process
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 2
