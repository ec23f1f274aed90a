"""The settings of the webhook deliverer (`sessionstream webhooks run`) and of what creates
subscriptions (the gateway, the CLI); field ``x`` is read from ``SESSIONSTREAM_X``."""

from __future__ import annotations

import base64
import binascii
import ipaddress

from pydantic import Field, SecretStr, field_validator, model_validator

from sessionstream.settings._base import Part

__all__ = ["WebhookSettings", "parse_networks", "parse_secret_keys"]


def parse_secret_keys(value: str) -> list[bytes]:
    """The keys of ``webhooks_secret_key``: comma-separated base64 of 32 bytes each (the
    first seals new secrets, every one opens), or ValueError saying the form."""
    keys = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        try:
            key = base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != 32:
            raise ValueError(
                "webhooks_secret_key: each key is the base64 of 32 random bytes "
                "(`openssl rand -base64 32`), comma-separated"
            )
        keys.append(key)
    if not keys:
        raise ValueError("webhooks_secret_key is empty")
    return keys


def parse_networks(
    value: str,
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``webhooks_allow_networks`` as networks (``127.0.0.1/32,10.1.0.0/16``; an address
    alone is its /32 or /128), or ValueError naming the bad one."""
    out = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(
                f"webhooks_allow_networks: {part!r} is not an address or a network (CIDR)"
            ) from None
    return tuple(out)


class WebhookSettings(Part):
    """Webhooks (`sessionstream webhooks run`): who delivers, how often it tries, how fast,
    and which addresses it may reach. The gateway reads the key and the address rules too:
    it seals new subscriptions' secrets and checks their URLs."""

    webhooks_group: str = "sessionstream-webhooks"
    """Consumer group of the webhook deliverers: instances of one group share the events
    topic's partitions (each event is delivered by the instance that owns its partition)."""

    webhooks_secret_key: SecretStr | None = None
    """Key that seals the subscriptions' signing secrets in PostgreSQL (AES-256-GCM): the
    base64 of 32 random bytes (``openssl rand -base64 32``). Several, comma-separated, to
    rotate: the first seals new secrets, any of them opens. Unset: no subscription can be
    created and the deliverer does not start."""

    webhooks_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """Longest one delivery attempt may take: connecting, sending, the answer's head and
    up to 16 KiB of its body; longer is a failed attempt (retried)."""

    webhooks_max_attempts: int = Field(default=12, ge=1, le=100)
    """Attempts per event and endpoint before it becomes a dead letter
    (``webhook_dead_letters``; ``sessionstream webhooks redeliver`` sends it again)."""

    webhooks_backoff_s: float = Field(default=1.0, gt=0)
    """Wait before the second attempt; it doubles for each further one (with jitter: a wait
    is drawn between half and all of it), up to ``webhooks_backoff_max_s``. With the
    defaults the 12 attempts span between about 14 and 27 minutes."""

    webhooks_backoff_max_s: float = Field(default=600.0, gt=0)
    """Longest wait between two attempts (a ``Retry-After`` of the receiver is honoured up
    to this)."""

    webhooks_concurrency: int = Field(default=4, ge=1, le=256)
    """Requests one deliverer instance has open at once to one endpoint (subscription);
    each session's events still go one after the other."""

    webhooks_backlog: int = Field(default=1000, ge=1)
    """Events one instance holds for one endpoint (waiting, or retrying). Past it, a
    failing endpoint's new events become dead letters at once (``backlog full``), so a dead
    receiver never stalls the others; one that answers, only slower than its events come,
    makes the instance stop reading until it is down to half (nothing of it is dropped)."""

    webhooks_refresh_ms: int = Field(default=20, ge=0, le=10_000)
    """Events are matched against the subscriptions as they were after the events were
    appended: a batch waits for a fresh look at ``webhook_subscriptions`` (a small query;
    the rows are read again only when they changed), at most one every this many ms."""

    webhooks_allow_private: bool = False
    """Deliver to private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7): an
    on-premises receiver. Loopback, link-local, multicast and unspecified addresses stay
    refused (``webhooks_allow_networks`` opens them one by one)."""

    webhooks_allow_networks: str = ""
    """Addresses or networks (comma-separated CIDRs) a webhook may reach although the
    rules above refuse them, e.g. ``127.0.0.1/32`` for a receiver on the same host. The
    URL's scheme must be http or https whatever this says."""

    @field_validator("webhooks_secret_key")
    @classmethod
    def _keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        parse_secret_keys(value.get_secret_value())
        return value

    @field_validator("webhooks_allow_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        parse_networks(value)
        return value.strip()

    @model_validator(mode="after")
    def _backoff_bounds(self) -> WebhookSettings:
        if self.webhooks_backoff_max_s < self.webhooks_backoff_s:
            raise ValueError("webhooks_backoff_max_s must be at least webhooks_backoff_s")
        return self
