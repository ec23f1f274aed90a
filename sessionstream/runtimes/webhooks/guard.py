"""The SSRF guard: which URLs a webhook may have, and which addresses a delivery may reach.

A tenant chooses the URL and the deliverer makes the request from inside the operator's
network, so the URL must not lead back into it. The rules:

- the scheme is ``http`` or ``https``, always; no user name or password in the URL, no
  fragment, at most 2048 characters;
- every address the host resolves to is checked, and one refused address refuses the URL
  (a name that resolves to a public and a private address is not half good):
  loopback, link-local (169.254/16, fe80::/10, the cloud metadata address among them),
  multicast, unspecified, site-local and the other special-purpose ranges are refused;
  private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) only with
  ``webhooks_allow_private``; an IPv4 address inside an IPv6 one (``::ffff:127.0.0.1``,
  6to4, NAT64) is judged as the IPv4 address;
- ``webhooks_allow_networks`` opens chosen addresses (a receiver on 127.0.0.1 in a test).

The check runs when a subscription is created and again on every connection the
deliverer opens (`GuardedBackend`): the name is resolved there, the addresses checked,
and the connection made to a checked address, so a name that resolved to a public
address at creation and to 127.0.0.1 later (DNS rebinding) reaches nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import httpcore

from sessionstream.errors import SessionstreamError
from sessionstream.settings import Settings
from sessionstream.settings.webhooks import parse_networks

__all__ = [
    "MAX_URL_CHARS",
    "AddressPolicy",
    "CheckedUrl",
    "GuardedBackend",
    "HostUnresolved",
    "Resolver",
    "UrlRefused",
    "check_url",
    "checked_addresses",
    "refusal",
    "system_resolver",
]

MAX_URL_CHARS: Final = 2048

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: (host, port) -> the addresses it resolves to
Resolver = Callable[[str, int], Awaitable[list[str]]]

_PRIVATE: Final[tuple[Network, ...]] = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")


class UrlRefused(SessionstreamError):
    """A webhook URL (or an address it resolves to) the guard refuses; `reason` says why.
    `final`: asking again cannot help (a refused address is refused again)."""

    final = True

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HostUnresolved(UrlRefused):
    """The URL's host resolves to nothing now: refused at creation, retried at delivery
    (a resolver that does not answer for a while is no reason to give up on an event)."""

    final = False


@dataclass(frozen=True)
class AddressPolicy:
    """What the guard lets through besides public addresses."""

    allow_private: bool = False
    allow_networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, settings: Settings) -> AddressPolicy:
        return cls(
            settings.webhooks_allow_private, parse_networks(settings.webhooks_allow_networks)
        )


def _embedded(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def refusal(address: str | IP, policy: AddressPolicy) -> str | None:
    """Why the guard refuses `address` (``loopback``, ``link-local``, ...), or None."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == n.version and ip in n for n in policy.allow_networks):
        return None
    for name, hit in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unspecified", ip.is_unspecified),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
    ):
        if hit:
            return name
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded(ip)
        if inner is not None:
            why = refusal(inner, policy)
            return None if why is None else f"{why} {inner} inside"
    if any(ip.version == n.version and ip in n for n in _PRIVATE):
        return None if policy.allow_private else "private"
    if not ip.is_global:
        return "special-purpose"
    return None


@dataclass(frozen=True)
class CheckedUrl:
    """A checked URL's parts: where to connect."""

    url: str
    scheme: str
    host: str
    port: int


def check_url(url: str) -> CheckedUrl:
    """The URL's target, or `UrlRefused` for what no setting allows: a scheme other than
    http(s), credentials, a fragment, no host, a bad port, control characters."""
    if len(url) > MAX_URL_CHARS:
        raise UrlRefused(f"a webhook URL has at most {MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise UrlRefused("a webhook URL has no spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise UrlRefused(f"not a URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UrlRefused(f"scheme {scheme or '(none)'!r}: a webhook URL is http or https")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("a webhook URL carries no user name or password")
    if parts.fragment:
        raise UrlRefused("a webhook URL has no fragment (#...): it is never sent")
    host = parts.hostname
    if not host:
        raise UrlRefused("a webhook URL names a host")
    return CheckedUrl(url, scheme, host, port or (443 if scheme == "https" else 80))


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (an address stands for itself)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise HostUnresolved(f"host {host!r} does not resolve ({e})") from None
    out: list[str] = []
    for _family, _type, _proto, _name, sockaddr in found:
        addr = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone (fe80::1%eth0) is no address
        if addr not in out:
            out.append(addr)
    return out


async def checked_addresses(
    host: str, port: int, policy: AddressPolicy, resolver: Resolver | None = None
) -> list[str]:
    """The addresses of `host`, every one allowed; `UrlRefused` naming the first that is
    not, or when there is none."""
    found = await (resolver or system_resolver)(host, port)
    if not found:
        raise HostUnresolved(f"host {host!r} resolves to no address")
    for addr in found:
        why = refusal(addr, policy)
        if why is not None:
            shown = host if host == addr else f"{host} ({addr})"
            raise UrlRefused(
                f"{shown} is {why}: webhooks do not reach it "
                "(SESSIONSTREAM_WEBHOOKS_ALLOW_PRIVATE / _ALLOW_NETWORKS open such addresses)"
            )
    return found


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the guard in the connect: the host is resolved
    here, every address checked, and the connection made to a checked one (TLS still
    verifies the certificate against the URL's host name, which httpcore passes on)."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver | None = None) -> None:
        self.policy = policy
        self.resolver = resolver
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await checked_addresses(host, port, self.policy, self.resolver)
        failed: Exception | None = None
        for addr in addresses:
            try:
                return await self._inner.connect_tcp(
                    addr,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                failed = e
        assert failed is not None
        raise failed

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise UrlRefused("webhooks reach no unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
