"""The OpenAI-compatible adapter asks again after a retryable failure that came before the
reply began, waiting what the provider's Retry-After says (RFC 9110: seconds or a date),
and never longer than a run's cancel allows. Against the local model server in this
process (loopback, no stack)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from sessionstream.apps._model_server import ModelServer, reply_text
from sessionstream.errors import ModelError
from sessionstream.runtimes.worker._signal import AbortSignal, RunCancelled
from sessionstream.runtimes.worker.openai_model import OpenAIChatModel, _retry_after


@pytest.fixture
async def server() -> AsyncIterator[ModelServer]:
    s = ModelServer(token_ms=1)
    await s.start()
    yield s
    await s.close()


async def test_a_rate_limit_is_asked_again_after_the_wait_the_provider_gave(
    server: ModelServer,
) -> None:
    model = OpenAIChatModel(server.url, "m", retries=2)
    prompt = "hello model_fail=429 model_fail_first=1 retry_after=1"
    t0 = time.monotonic()
    try:
        assert await model.complete(prompt, signal=AbortSignal()) == reply_text(prompt)
    finally:
        await model.aclose()
    assert server._asked[prompt] == 2
    assert time.monotonic() - t0 >= 1.0, "the second request came before the Retry-After"


async def test_more_failures_than_retries_end_with_the_last_error(server: ModelServer) -> None:
    model = OpenAIChatModel(server.url, "m", retries=2)
    prompt = "model_fail=503 model_fail_first=9 retry_after=0"
    try:
        with pytest.raises(ModelError) as err:
            await model.complete(prompt, signal=AbortSignal())
    finally:
        await model.aclose()
    assert err.value.status == 503 and err.value.retry_after_s == 0.0
    assert server._asked[prompt] == 3  # the request and its two retries


async def test_a_failure_that_is_not_retryable_is_asked_once(server: ModelServer) -> None:
    model = OpenAIChatModel(server.url, "m", retries=2)
    prompt = "model_fail=400"
    try:
        with pytest.raises(ModelError) as err:
            await model.complete(prompt, signal=AbortSignal())
    finally:
        await model.aclose()
    assert err.value.status == 400 and not err.value.retryable
    assert server._asked[prompt] == 1


async def test_a_cancel_ends_the_wait_for_a_retry_at_once(server: ModelServer) -> None:
    model = OpenAIChatModel(server.url, "m", retries=2)
    prompt = "model_fail=429 retry_after=30"
    signal = AbortSignal()
    task = asyncio.create_task(model.complete(prompt, signal=signal))
    try:
        deadline = time.monotonic() + 5
        while server._asked.get(prompt, 0) < 1:
            assert time.monotonic() < deadline, "the first request never came"
            await asyncio.sleep(0.01)
        signal.abort("user")
        with pytest.raises(RunCancelled):
            await asyncio.wait_for(task, 2)
    finally:
        await model.aclose()
    assert server._asked[prompt] == 1


def test_retry_after_is_seconds_or_an_http_date() -> None:
    assert _retry_after("7") == 7.0
    assert _retry_after(None) is None and _retry_after("soon") is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    wait = _retry_after(later)
    assert wait is not None and 15 <= wait <= 21
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=20), usegmt=True)
    assert _retry_after(past) == 0.0
