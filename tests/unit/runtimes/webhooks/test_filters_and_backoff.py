"""Which event types a subscription wants, and when a failed delivery is tried again."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstream.runtimes.webhooks import filters
from sessionstream.runtimes.webhooks.backoff import RetryPolicy
from sessionstream.runtimes.webhooks.filters import check_patterns, matches
from sessionstream.schemas.events import EVENT_TYPES
from sessionstream.settings.webhooks import WebhookSettings


@pytest.mark.parametrize(
    ("patterns", "event_type", "wanted"),
    [
        (["run.finished"], "run.finished", True),
        (["run.finished"], "run.started", False),
        (["run.*"], "run.started", True),
        (["run.*"], "run.lease_granted", True),
        (["run.*"], "runner.x", False),
        (["model.request.*"], "model.request.finished", True),
        (["model.*"], "model.request.finished", True),
        (["tool.*", "run.finished"], "command.rejected", False),
        (["*"], "command.rejected", True),
    ],
)
def test_patterns_match_types_and_prefixes(
    patterns: list[str], event_type: str, wanted: bool
) -> None:
    assert matches(check_patterns(patterns), event_type) is wanted


def test_every_event_type_is_a_pattern_of_its_own() -> None:
    assert check_patterns(sorted(EVENT_TYPES)) == sorted(EVENT_TYPES)


@pytest.mark.parametrize("bad", ["run.finishd", "runs.*", "run.", ".*", "**", "run.finished.*", ""])
def test_a_pattern_naming_no_type_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="none of the protocol's"):
        check_patterns([bad])


def test_no_pattern_or_too_many_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="at least one"):
        check_patterns([])
    # every distinct pattern there is (45) fits the bound today; a smaller one shows it
    monkeypatch.setattr(filters, "MAX_PATTERNS", 3)
    with pytest.raises(ValueError, match="at most 3"):
        check_patterns(["run.*", "tool.*", "model.*", "step.*"])


def test_patterns_are_kept_once_in_order() -> None:
    assert check_patterns([" run.* ", "run.*", "*"]) == ["run.*", "*"]


def test_the_schedule_doubles_up_to_its_ceiling() -> None:
    p = RetryPolicy(attempts=6, first_s=1.0, max_s=5.0)
    assert [p.ceiling(n) for n in range(1, 7)] == [1, 2, 4, 5, 5, 5]
    assert not p.gives_up(5) and p.gives_up(6)
    assert p.ceiling(10_000) == 5.0  # no overflow however many


@given(
    failures=st.integers(1, 200),
    first=st.floats(0.01, 10),
    cap=st.floats(10, 1000),
    seed=st.integers(0, 2**32),
)
def test_a_wait_is_between_half_and_all_of_its_ceiling(
    failures: int, first: float, cap: float, seed: int
) -> None:
    p = RetryPolicy(attempts=10, first_s=first, max_s=cap)
    top = p.ceiling(failures)
    assert top / 2 <= p.delay(failures, rnd=random.Random(seed)) <= top


def test_jitter_spreads_the_waits() -> None:
    p = RetryPolicy(attempts=10, first_s=8, max_s=600)
    rnd = random.Random(1)
    waits = {round(p.delay(3, rnd=rnd), 3) for _ in range(50)}
    assert len(waits) > 40 and min(waits) >= 16 and max(waits) <= 32


def test_a_retry_after_is_waited_up_to_the_ceiling_of_all() -> None:
    p = RetryPolicy(attempts=10, first_s=1, max_s=60)
    assert p.delay(1, retry_after=30) == 30
    assert p.delay(1, retry_after=3600) == 60
    assert 0.5 <= p.delay(1, retry_after=0) <= 1


def test_the_defaults_span_what_the_settings_say() -> None:
    s = WebhookSettings()
    p = RetryPolicy(s.webhooks_max_attempts, s.webhooks_backoff_s, s.webhooks_backoff_max_s)
    low, high = p.span()
    assert 13 * 60 < low < 14 * 60 and 27 * 60 < high < 28 * 60
    assert "between about 14 and 27 minutes" in (
        " ".join((WebhookSettings.model_fields["webhooks_backoff_s"].description or "").split())
    )
