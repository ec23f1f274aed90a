"""The SSRF guard: which addresses and URLs a webhook may reach, at creation and at every
connection (a name that resolves elsewhere later reaches nothing refused)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpcore
import pytest

from sessionstream.runtimes.webhooks.guard import (
    AddressPolicy,
    GuardedBackend,
    UrlRefused,
    check_url,
    checked_addresses,
    refusal,
)
from sessionstream.settings.webhooks import parse_networks

CLOSED = AddressPolicy()
PRIVATE = AddressPolicy(allow_private=True)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("fec0::1", "site-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd00::1", "private"),
        ("2002:7f00:1::", "loopback 127.0.0.1 inside"),  # 6to4 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "link-local 169.254.169.254 inside"),  # NAT64
        ("0.1.2.3", "special-purpose"),
        ("192.0.2.1", "special-purpose"),  # documentation
        ("198.18.0.1", "special-purpose"),  # benchmarking
        ("255.255.255.255", "special-purpose"),
        ("240.0.0.1", "special-purpose"),
        ("2001:db8::1", "special-purpose"),
        ("8.8.8.8", None),
        ("93.184.215.14", None),
        ("2606:4700::1111", None),
    ],
)
def test_the_classifier(address: str, why: str | None) -> None:
    assert refusal(address, CLOSED) == why


def test_private_addresses_open_with_the_setting_and_nothing_else_does() -> None:
    assert refusal("10.1.2.3", PRIVATE) is None
    assert refusal("fd00::1", PRIVATE) is None
    for inner in ("127.0.0.1", "169.254.169.254", "::1", "0.0.0.0", "224.0.0.1"):
        assert refusal(inner, PRIVATE) is not None, inner


def test_allowed_networks_open_exactly_themselves() -> None:
    policy = AddressPolicy(allow_networks=parse_networks("127.0.0.1/32, 169.254.10.0/24"))
    assert refusal("127.0.0.1", policy) is None
    assert refusal("::ffff:127.0.0.1", policy) is None  # the same address
    assert refusal("127.0.0.2", policy) == "loopback"
    assert refusal("169.254.10.7", policy) is None
    assert refusal("169.254.169.254", policy) == "link-local"
    with pytest.raises(ValueError, match="not an address or a network"):
        parse_networks("localhost")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///etc/passwd", "scheme 'file'"),
        ("gopher://127.0.0.1:6379/_SET%20x", "scheme 'gopher'"),
        ("ftp://example.com/", "scheme 'ftp'"),
        ("javascript:alert(1)", "scheme 'javascript'"),
        ("//example.com/x", "scheme '(none)'"),
        ("http://user:pw@example.com/", "no user name or password"),
        ("http://example.com/#frag", "no fragment"),
        ("http:///path", "names a host"),
        ("http://example.com:99999/", "not a URL"),
        ("http://exa mple.com/", "no spaces"),
        ("http://example.com/\r\nHost: x", "control characters"),
        ("https://example.com/" + "a" * 2048, "at most 2048"),
    ],
)
def test_urls_no_setting_allows(url: str, why: str) -> None:
    with pytest.raises(UrlRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_url(url)


def test_a_checked_url_names_where_to_connect() -> None:
    assert check_url("HTTPS://Example.com/hook?x=1").port == 443
    assert check_url("http://[::1]:8080/").host == "::1"


def _resolver(answers: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, _port: int) -> list[str]:
        return answers[host]

    return resolve


def test_one_refused_address_refuses_the_name() -> None:
    both = _resolver({"mixed.example": ["93.184.215.14", "10.0.0.5"]})
    with pytest.raises(UrlRefused, match=r"mixed.example \(10.0.0.5\) is private"):
        asyncio.run(checked_addresses("mixed.example", 443, CLOSED, both))
    assert asyncio.run(checked_addresses("mixed.example", 443, PRIVATE, both)) == [
        "93.184.215.14",
        "10.0.0.5",
    ]


def test_localhost_and_numeric_hosts_resolve_to_loopback_and_are_refused() -> None:
    for host in ("localhost", "127.1", "2130706433", "0x7f000001"):
        with pytest.raises(UrlRefused, match="is loopback"):
            asyncio.run(checked_addresses(host, 80, CLOSED))


def test_a_name_that_resolves_to_loopback_at_connect_time_is_not_connected() -> None:
    """DNS rebinding: the name was public when the subscription was made; the connection
    resolves it again and finds 127.0.0.1, where a server listens: nothing connects."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.settimeout(0.3)
    answers = {"rebind.example": ["93.184.215.14"]}
    resolver = _resolver(answers)
    assert asyncio.run(checked_addresses("rebind.example", port, CLOSED, resolver))
    answers["rebind.example"] = ["127.0.0.1"]
    backend = GuardedBackend(CLOSED, resolver)
    with pytest.raises(UrlRefused, match=r"127\.0\.0\.1"):
        asyncio.run(backend.connect_tcp("rebind.example", port, timeout=1))
    with pytest.raises(TimeoutError):
        listener.accept()  # no connection came
    # the same with the address allowed: it connects, to the checked address
    opened = GuardedBackend(
        AddressPolicy(allow_networks=(ipaddress.ip_network("127.0.0.1/32"),)), resolver
    )

    async def connect() -> None:
        stream = await opened.connect_tcp("rebind.example", port, timeout=1)
        await stream.aclose()

    asyncio.run(connect())
    conn, _ = listener.accept()
    conn.close()
    listener.close()


def test_no_unix_socket() -> None:
    with pytest.raises(UrlRefused):
        asyncio.run(GuardedBackend(CLOSED).connect_unix_socket("/var/run/docker.sock"))


def test_httpcore_uses_the_guard_for_every_connection() -> None:
    """The pool's requests go through the backend: a URL naming 127.0.0.1 is refused
    before any byte is sent."""

    async def post() -> None:
        async with httpcore.AsyncConnectionPool(network_backend=GuardedBackend(CLOSED)) as pool:
            await pool.request("POST", "http://127.0.0.1:9/", content=b"{}")

    with pytest.raises(UrlRefused, match=r"127\.0\.0\.1 is loopback"):
        asyncio.run(post())
