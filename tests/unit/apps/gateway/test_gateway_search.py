"""What the search routes refuse before any query, from the spec: a filter out of bounds
is 400 `invalid_request`, a forged or cut cursor 400 `invalid_cursor`, another search's
400 `cursor_mismatch` (other filters, another tenant); a misspelt or repeated parameter is
refused rather than ignored; the call with `limit` alone answers as before."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from sessionstream.apps.gateway import search
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.runtimes.sink.cursor import CursorCodec, Position
from sessionstream.settings import GatewaySettings, Settings

SECRET = "x" * 32


def _codec() -> CursorCodec:
    return search.cursor_codec(Settings(gateway_cursor_secret=SecretStr(SECRET)))


def _refused(call: object, *args: object, **kw: object) -> ApiError:
    with pytest.raises(ApiError) as e:
        call(*args, **kw)  # type: ignore[operator]
    assert e.value.status == 400
    return e.value


def test_filters_out_of_bounds_are_400_invalid_request_naming_the_filter() -> None:
    for status, actor, labels, since, until in (
        ("'; drop table agent_runs; --", None, [], None, None),
        ("completed", None, [], None, None),  # a run's status, not a session's
        (None, "", [], None, None),
        (None, None, ["novalue"], None, None),
        (None, None, [], "yesterday", None),
        (None, None, [], "2026-01-02", "2026-01-01"),
    ):
        kind = "sessions" if status == "completed" else "runs"
        e = _refused(search.search_of, kind, "acme", status, actor, labels, since, until)
        assert e.code == "invalid_request"
    e = _refused(search.search_of, "runs", "acme", "stopped", None, [], None, None)
    assert e.message.startswith("status:")


def test_the_search_is_always_of_the_keys_tenant() -> None:
    got = search.search_of("runs", "acme", "failed", "alice", ["a:b"], None, None, "acme:s1")
    assert got.tenant_id == "acme" and got.kind == "runs"


def test_cursors_are_refused_with_a_code_that_says_why() -> None:
    codec = _codec()
    acme = search.search_of("runs", "acme", "failed", None, [], None, None)
    globex = search.search_of("runs", "globex", "failed", None, [], None, None)
    other = search.search_of("runs", "acme", "completed", None, [], None, None)
    good = codec.encode(Position(10, "r1"), acme.digest())
    assert search.position(codec, acme, good) == Position(10, "r1")
    assert search.position(codec, acme, None) is None
    assert _refused(search.position, codec, acme, good[:-3]).code == "invalid_cursor"
    assert _refused(search.position, codec, acme, "forged." + good[-5:]).code == "invalid_cursor"
    assert _refused(search.position, codec, other, good).code == "cursor_mismatch"
    assert _refused(search.position, codec, globex, good).code == "cursor_mismatch"
    restarted = search.cursor_codec(Settings())  # no secret: a key of its own
    assert _refused(search.position, restarted, acme, good).code == "invalid_cursor"


def test_a_configured_secret_signs_alike_in_every_gateway() -> None:
    acme = search.search_of("runs", "acme", None, None, [], None, None)
    cursor = _codec().encode(Position(1, "r"), acme.digest())
    assert search.position(_codec(), acme, cursor) == Position(1, "r")


def test_a_short_secret_is_a_settings_error() -> None:
    with pytest.raises(ValidationError):
        GatewaySettings(gateway_cursor_secret=SecretStr("too short"))


@pytest.mark.parametrize(
    "query",
    [
        [("stauts", "running")],
        [("tenant", "globex")],  # the tenant is the key's, never a parameter
        [("status", "running"), ("status", "failed")],
        [("cursor", "a"), ("cursor", "b")],
        [("offset", "100")],
    ],
)
def test_a_misspelt_unknown_or_repeated_parameter_is_refused(query: list[tuple[str, str]]) -> None:
    e = _refused(search.check_parameters, query, search.RUN_PARAMETERS)
    assert e.code == "invalid_request"


def test_labels_repeat_and_the_known_parameters_pass() -> None:
    search.check_parameters(
        [("label", "a:1"), ("label", "b:2"), ("status", "failed,running"), ("limit", "5")],
        search.RUN_PARAMETERS,
    )
    search.check_parameters([("order", "created")], search.SESSION_PARAMETERS)
    _refused(search.check_parameters, [("session", "s1")], search.SESSION_PARAMETERS)


def test_sessions_with_limit_alone_answer_as_before_and_a_search_is_paged() -> None:
    assert search.as_before(None, None, None, None, None, None, None)
    assert search.as_before("updated", None, None, None, None, None, None)
    assert not search.as_before("created", None, None, None, None, None, None)
    assert not search.as_before(None, "idle", None, None, None, None, None)
    assert not search.as_before(None, None, None, None, None, None, "cursor")
    e = _refused(search.as_before, "updated", "idle", None, None, None, None, None)
    assert e.code == "invalid_request"
