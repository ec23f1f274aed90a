"""A `ChatModel` that streams from any OpenAI-compatible chat-completions API (httpx).

`chat` POSTs `{base_url}/chat/completions` with `"stream": true` — the messages, the
tools as `function` definitions, structured output as `response_format: json_schema` —
and joins the `choices[0].delta.content` of the server-sent events up to `data: [DONE]`,
and the pieces of each `delta.tool_calls[i]` into the reply's tool calls. `complete(prompt)`
is a chat of one user message (after the configured system message). When the run's
signal is aborted the request's task is cancelled, which closes the response and its
connection: the provider sees the client go away (and stops generating, and billing)
within milliseconds, instead of finishing a reply nobody reads.

Provider failures become `sessionstream.errors.ModelError` (an HTTP status, a stream that
is not chat-completions) or `ModelUnavailable` (no connection, or silence past the
timeout). The API key is sent as a bearer token and appears in no message or repr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx

from sessionstream.adapters._http import retry_after_s
from sessionstream.errors import ConfigurationError, ModelError, ModelUnavailable
from sessionstream.runtimes.worker._signal import AbortSignal, RunCancelled
from sessionstream.runtimes.worker.chat import ToolCall
from sessionstream.runtimes.worker.model import Completion, DeltaCallback
from sessionstream.settings import Settings
from sessionstream.settings.components import parse_prices

__all__ = ["OpenAIChatModel"]

log = logging.getLogger("sessionstream.worker")


class OpenAIChatModel:
    """Chat completions, streamed; one instance per worker (it keeps a connection pool)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        system: str | None = None,
        prices: tuple[float, float] | None = None,
        retries: int = 2,
        max_retry_wait_s: float = 30.0,
    ) -> None:
        self.name = model
        #: US dollars per million input / output tokens (a reply's cost is recorded)
        self.prices = prices
        #: a retryable failure before the reply began (no answer, 408, 409, 429, 5xx) is
        #: asked again this many times, after the provider's Retry-After (at most
        #: `max_retry_wait_s`) or a doubling back-off from 0.5 s
        self.retries = retries
        self.max_retry_wait_s = max_retry_wait_s
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.timeout_s = timeout_s
        self.system = system
        self._api_key = api_key
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_settings(cls, s: Settings) -> OpenAIChatModel:
        """`model_base_url`, `model_name`, `model_api_key`, `model_timeout_s`."""
        if not s.model_base_url:
            raise ConfigurationError("SESSIONSTREAM_MODEL_BASE_URL is not set")
        key = s.model_api_key.get_secret_value() if s.model_api_key is not None else None
        prices = parse_prices(s.model_prices) if s.model_prices else None
        return cls(
            s.model_base_url,
            s.model_name,
            api_key=key,
            timeout_s=s.model_timeout_s,
            prices=prices,
            retries=s.model_retries,
        )

    def __repr__(self) -> str:
        return f"OpenAIChatModel({self.base_url!r}, {self.name!r})"

    async def complete(
        self, prompt: str, *, signal: AbortSignal, on_delta: DeltaCallback | None = None
    ) -> str:
        """The model's reply to `prompt` (after the configured system message)."""
        messages = [{"role": "user", "content": prompt}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        return await self.chat(messages, signal=signal, on_delta=on_delta)

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        signal: AbortSignal,
        tools: Sequence[dict[str, Any]] = (),
        output: dict[str, Any] | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        """The model's reply to the conversation: its text and the tool calls it asks for;
        RunCancelled as soon as `signal` is aborted (also while it waits to ask again).
        `on_delta` is called with each piece of the text as it streams (a request asked
        again streams its answer again from the start)."""
        body: dict[str, Any] = {
            "model": self.name,
            "messages": list(messages),
            "stream": True,
            # the last chunk then carries the request's token counts
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = list(tools)
        if output is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": output["name"], "schema": output["schema"]},
            }
        attempt = 0
        while True:
            try:
                return await self._attempt(body, signal, on_delta)
            except ModelError as e:
                if not e.retryable or attempt >= self.retries:
                    raise
                wait = e.retry_after_s if e.retry_after_s is not None else 0.5 * 2**attempt
                wait = min(wait, self.max_retry_wait_s)
                attempt += 1
                log.warning(
                    "model %s: %s; asking again in %.1f s (%d of %d)",
                    self.name,
                    str(e).splitlines()[0],
                    wait,
                    attempt,
                    self.retries,
                )
                if not await signal.sleep(wait):
                    raise RunCancelled(signal.reason or "aborted") from e

    async def _attempt(
        self, body: dict[str, Any], signal: AbortSignal, on_delta: DeltaCallback | None = None
    ) -> Completion:
        signal.raise_if_aborted()
        stream = asyncio.ensure_future(self._stream(body, on_delta))
        aborted = asyncio.ensure_future(signal.wait())
        try:
            await asyncio.wait({stream, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # also when our own task is cancelled: the request must not outlive the call
            aborted.cancel()
            if not stream.done():
                stream.cancel()  # unwinds `async with client.stream(...)`: the socket closes
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await stream
        if not stream.cancelled() and stream.exception() is None:
            return stream.result()
        if signal.aborted:
            raise RunCancelled(signal.reason or "aborted")
        return stream.result()  # raises the stream's error

    async def aclose(self) -> None:
        """Close the connection pool (the worker does at shutdown)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- HTTP ----------
    def _http(self) -> httpx.AsyncClient:
        # A client belongs to the loop it was first used in; a new loop gets its own.
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            headers = {"accept": "text/event-stream"}
            if self._api_key:
                headers["authorization"] = f"Bearer {self._api_key}"
            self._client = httpx.AsyncClient(headers=headers, timeout=self.timeout_s)
            self._loop = loop
        return self._client

    async def _stream(
        self, body: dict[str, Any], on_delta: DeltaCallback | None = None
    ) -> Completion:
        sent = time.monotonic()
        try:
            async with self._http().stream("POST", self.url, json=body) as resp:
                if resp.status_code >= 400:
                    text = _error_text(await resp.aread())
                    raise ModelError(
                        f"model API answered {resp.status_code}: {text}",
                        url=self.url,
                        status=resp.status_code,
                        retry_after_s=_retry_after(resp.headers.get("retry-after")),
                    )
                if resp.headers.get("content-type", "").startswith("application/json"):
                    # a server that ignores "stream": the whole completion in one body
                    whole = _json(await resp.aread(), self.url)
                    text, calls, reason = _message(whole, self.url)
                    return self._completion(
                        text, whole.get("usage"), whole.get("model"), reason, sent, calls=calls
                    )
                return await self._read_events(resp, sent, on_delta)
        except httpx.TimeoutException as e:
            raise ModelUnavailable(
                f"model API silent for more than {self.timeout_s}s ({type(e).__name__})",
                url=self.url,
            ) from e
        except httpx.TransportError as e:
            raise ModelUnavailable(f"model API unreachable: {e!r}", url=self.url) from e
        except httpx.HTTPError as e:
            raise ModelError(f"model API request failed: {e!r}", url=self.url) from e

    def _completion(
        self,
        text: str,
        usage: Any,
        model: Any,
        finish_reason: str | None,
        sent: float,
        first: float | None = None,
        calls: Sequence[ToolCall] = (),
    ) -> Completion:
        usage = usage if isinstance(usage, dict) else {}
        tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        tokens_in = tokens_in if isinstance(tokens_in, int) and tokens_in >= 0 else None
        tokens_out = tokens_out if isinstance(tokens_out, int) and tokens_out >= 0 else None
        cost = None
        if self.prices is not None and tokens_in is not None and tokens_out is not None:
            cost = (tokens_in * self.prices[0] + tokens_out * self.prices[1]) / 1_000_000
        return Completion(
            text,
            model=model if isinstance(model, str) else self.name,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            first_token_ms=None if first is None else int((first - sent) * 1000),
            finish_reason=finish_reason,
            cost_usd=cost,
            tool_calls=calls,
        )

    async def _read_events(
        self, resp: httpx.Response, sent: float, on_delta: DeltaCallback | None = None
    ) -> Completion:
        parts: list[str] = []
        #: the tool calls' pieces by their index: id, name, argument pieces
        calls: dict[int, tuple[list[str], list[str], list[str]]] = {}
        finished = False
        first: float | None = None
        usage: Any = None
        model: Any = None
        reason: str | None = None
        async for line in resp.aiter_lines():
            # SSE: `data: ...` carries a chunk; blank lines end events; `:` lines keep alive
            if not line.startswith("data:") or finished:
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                finished = True  # read on to the end, so the connection can be reused
                continue
            chunk = _json(data.encode(), self.url)
            if "error" in chunk:
                raise ModelError(
                    f"model API error mid-stream: {chunk['error']}", url=self.url, status=200
                )
            usage = chunk.get("usage") or usage
            model = chunk.get("model") or model
            for choice in chunk.get("choices") or []:  # none in a usage-only chunk
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                for piece in delta.get("tool_calls") or ():
                    _add_call_piece(calls, piece, self.url)
                content = delta.get("content")
                if isinstance(content, str):
                    if content and first is None:
                        first = time.monotonic()
                    parts.append(content)
                    if content and on_delta is not None:
                        on_delta(content)
                if choice.get("finish_reason"):
                    reason = str(choice["finish_reason"])
                    # the usage chunk comes after the finishing one: read on to [DONE]
        if not finished and reason is None:
            raise ModelError("model API stream ended before [DONE]", url=self.url, status=200)
        made = [
            ToolCall("".join(i), "".join(n), "".join(a) or "{}")
            for _, (i, n, a) in sorted(calls.items())
        ]
        return self._completion("".join(parts), usage, model, reason, sent, first, made)


def _add_call_piece(
    calls: dict[int, tuple[list[str], list[str], list[str]]], piece: Any, url: str
) -> None:
    """One streamed piece of a tool call: the first names the call's id and function, the
    others carry more of its arguments' JSON text (OpenAI's `delta.tool_calls[i]`)."""
    if not isinstance(piece, dict) or not isinstance(piece.get("index", 0), int):
        raise ModelError(f"not a tool call delta: {str(piece)[:200]}", url=url, status=200)
    ids, names, args = calls.setdefault(piece.get("index", 0), ([], [], []))
    fn = piece.get("function") or {}
    if isinstance(piece.get("id"), str):
        ids.append(piece["id"])
    if isinstance(fn.get("name"), str):
        names.append(fn["name"])
    if isinstance(fn.get("arguments"), str):
        args.append(fn["arguments"])


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header's wait in seconds: delta-seconds or an HTTP date (RFC 9110)."""
    return retry_after_s(value, time.time())


def _json(raw: bytes, url: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise ModelError(f"model API sent invalid JSON: {raw[:200]!r}", url=url, status=200) from e
    if not isinstance(value, dict):
        raise ModelError(
            f"model API sent {type(value).__name__}, not an object", url=url, status=200
        )
    return value


def _message(completion: dict[str, Any], url: str) -> tuple[str, list[ToolCall], str | None]:
    """A whole (not streamed) completion's text, tool calls and finish reason."""
    try:
        choice = completion["choices"][0]
        message = choice["message"]
        calls = [ToolCall.from_json(c) for c in message.get("tool_calls") or ()]
        reason = choice.get("finish_reason")
        return str(message["content"] or ""), calls, None if reason is None else str(reason)
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise ModelError(
            f"not a chat completion: {str(completion)[:200]}", url=url, status=200
        ) from e


def _error_text(raw: bytes) -> str:
    """The provider's own message (OpenAI shape: {"error": {"message", "code"}}), short."""
    try:
        err = json.loads(raw)["error"]
        text = f"{err.get('message')} ({err.get('code') or err.get('type')})"
    except (ValueError, KeyError, TypeError, AttributeError):
        text = raw.decode(errors="replace")
    return text[:500]
