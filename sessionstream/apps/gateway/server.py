"""Serve the gateway with uvicorn until SIGTERM/SIGINT."""

from __future__ import annotations

import logging

import uvicorn

from sessionstream.apps.gateway.app import create_app
from sessionstream.apps.gateway.protocol import ConnectionLimits, guarded_protocol
from sessionstream.settings import Settings

__all__ = ["run_gateway"]

log = logging.getLogger("sessionstream.apps.gateway")


def run_gateway(settings: Settings, log_level: str = "INFO", access_log: bool = False) -> int:
    app = create_app(settings, settle_gc=True)
    log.info(
        "gateway on http://%s:%d/ (API /v1, OpenAPI /openapi.json%s)",
        settings.gateway_host,
        settings.gateway_port,
        ", Swagger UI /docs" if settings.gateway_docs else "",
    )
    limits = ConnectionLimits(
        header_timeout_s=settings.gateway_header_timeout_s,
        body_timeout_s=settings.gateway_body_timeout_s,
        max_connections=settings.gateway_max_connections,
        max_per_address=settings.gateway_max_connections_per_address,
    )
    forwarded = settings.gateway_forwarded_allow_ips.strip()
    config = uvicorn.Config(
        app,
        host=settings.gateway_host,
        port=settings.gateway_port,
        log_level=log_level.lower(),
        # uvicorn's lines go through the process's handler, with its key redaction
        log_config=None,
        access_log=access_log,
        loop="uvloop",
        http=guarded_protocol(limits),
        timeout_keep_alive=settings.gateway_idle_timeout_s,
        # X-Forwarded-For names the client only when it comes from a proxy we were told
        # of (uvicorn's default trusts any loopback peer: one could pick its own address)
        proxy_headers=bool(forwarded),
        forwarded_allow_ips=forwarded or None,
        # the lifespan starts the Kafka threads: a failure there must stop the process
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 2
