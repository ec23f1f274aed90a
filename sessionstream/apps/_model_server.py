"""A small OpenAI-compatible chat-completions server, shipped for the demo and the tests.

`POST /v1/chat/completions` with `"stream": true` answers a deterministic reply (the same
text `FakeModel` gives) as server-sent events, one word per chunk, paced so that an abort
lands mid-stream. While it streams it also reads the socket, so it notices the moment a
client goes away and records it (`ModelServer.served`): that is how the tests measure how
soon an aborted `OpenAIChatModel` tears its HTTP stream down.

Words in the last user message steer it, like the reference agent's prompt words:
`model_ms=N` spreads the reply over N ms (default `token_ms` per word);
`model_fail=<status>` answers that HTTP status with an OpenAI-style error body (only to
the first N requests of the prompt with `model_fail_first=N`; with a `Retry-After: S`
header with `retry_after=S`);
`model_fail=bad_json` streams a chunk that is not JSON; `model_fail=stall` sends the
headers and the first chunk, then nothing.

It speaks the chat shape as `FakeModel.chat` does (`fake_chat_reply`): given `tools`, the
word `call=NAME` asks for tool NAME (streamed as `delta.tool_calls` pieces, finish reason
`tool_calls`) until a tool result follows the user message; given `response_format` with a
`json_schema`, it answers JSON of that schema.

Stdlib asyncio only: HTTP/1.1 with keep-alive and chunked responses is all a chat client
needs, and reading the socket while writing is what makes the disconnect time exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from sessionstream.runtimes.worker.model import fake_chat_reply

__all__ = ["ModelServer", "Served", "free_port", "reply_text"]

log = logging.getLogger("sessionstream.model_server")

_MAX_BODY = 1 << 20


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for a server started as a process)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
    return port


def reply_text(prompt: str) -> str:
    """The answer to `prompt`: FakeModel's, so a run reads the same with either model."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return f"answer[{digest}] to: {prompt[:80]}"


@dataclass
class Served:
    """One chat-completions request as the server saw it (times are `time.time()`)."""

    number: int
    prompt: str
    started: float
    #: the request's body as sent (messages, tools, response_format)
    body: dict[str, Any] = field(default_factory=dict)
    chunks_sent: int = 0
    #: the last chunk and `[DONE]` were written
    completed: float | None = None
    #: the client closed the connection before the reply was complete
    disconnected: float | None = None


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool = True
    words: dict[str, str] = field(default_factory=dict)


class ModelServer:
    """`await start()`, then `url` is the base URL (`.../v1`) to give a client."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token_ms: float = 25.0,
        api_key: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.token_ms = token_ms
        self._api_key = api_key
        self.served: list[Served] = []
        #: requests seen per prompt (`model_fail_first`)
        self._asked: dict[str, int] = {}
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}
        self._closing = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._closing = True  # what ends now was not ended by a client
            self._server.close()
            # and the open connections (Python 3.11 has no Server.close_clients): each
            # handler then sees its socket end and returns, rather than being cancelled
            for writer in list(self._connections):
                writer.close()
            if self._connections:
                await asyncio.wait(set(self._connections.values()), timeout=5)
            await self._server.wait_closed()

    def _mark(self, served: Served) -> None:
        if not self._closing and served.completed is None and served.disconnected is None:
            served.disconnected = time.time()

    # -- HTTP ----------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[writer] = task
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    return
                keep = await self._respond(req, reader, writer)
                if not (keep and req.keep_alive):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            del self._connections[writer]
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _respond(
        self, req: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection must not be reused."""
        if not req.path.rstrip("/").endswith("/chat/completions"):
            return await _error(writer, 404, f"no route {req.path}", "not_found")
        if req.method != "POST":
            return await _error(writer, 405, "use POST", "method_not_allowed")
        if self._api_key is not None and req.headers.get("authorization") != (
            f"Bearer {self._api_key}"
        ):
            return await _error(writer, 401, "Incorrect API key provided", "invalid_api_key")
        try:
            body = json.loads(req.body)
            prompt = str([m for m in body["messages"] if m.get("role") == "user"][-1]["content"])
            model = str(body.get("model", "local"))
            self._reply(body)  # tools and response_format it can read
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return await _error(writer, 400, "expected {model, messages: [...]}", "bad_request")
        if body.get("stream") is not True:
            return await _error(writer, 400, "this server only streams", "stream_required")
        words = dict(w.split("=", 1) for w in prompt.split() if "=" in w)
        fail = words.get("model_fail")
        # `model_fail_first=N`: only this prompt's first N requests fail (a retry succeeds)
        asked = self._asked[prompt] = self._asked.get(prompt, 0) + 1
        first = words.get("model_fail_first", "")
        if fail is not None and fail.isdigit() and (not first.isdigit() or asked <= int(first)):
            wait = words.get("retry_after")
            extra = f"retry-after: {wait}\r\n" if wait is not None else ""
            return await _error(
                writer, int(fail), f"failure {fail} asked for", "asked_for", headers=extra
            )
        served = Served(len(self.served) + 1, prompt, time.time(), body)
        self.served.append(served)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return await self._stream(served, model, words, reader, writer, usage=usage)

    @staticmethod
    def _reply(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """The reply's text and its tool calls (as `delta.tool_calls` entries)."""
        fmt = body.get("response_format") or {}
        schema = fmt.get("json_schema") if fmt.get("type") == "json_schema" else None
        text, calls = fake_chat_reply(body["messages"], body.get("tools") or (), schema)
        return text, [{"index": i, **c.to_json()} for i, c in enumerate(calls)]

    async def _stream(
        self,
        served: Served,
        model: str,
        words: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        usage: bool = False,
    ) -> bool:
        text, calls = self._reply(served.body) if served.body else (reply_text(served.prompt), [])
        tokens = re.findall(r"\S+\s*", text) or [""]
        total_ms = words.get("model_ms", "")
        per_token_ms = int(total_ms) / len(tokens) if total_ms.isdigit() else self.token_ms
        delay = per_token_ms / 1000
        fail = words.get("model_fail")
        # The client sends nothing while it reads a reply, so a read that ends means it left.
        gone = asyncio.ensure_future(reader.read(1))
        gone.add_done_callback(lambda _: self._mark(served))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": f"chatcmpl-{served.number}",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return _sse(json.dumps(data))

        try:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            writer.write(chunk({"role": "assistant", "content": ""}))
            await writer.drain()
            if fail == "stall":
                await gone
                return False
            for token in tokens if not calls else ():
                await asyncio.wait({gone}, timeout=delay)
                if gone.done():
                    return False
                writer.write(_sse("{not json") if fail == "bad_json" else chunk({"content": token}))
                await writer.drain()
                served.chunks_sent += 1
            for call in calls:  # the id and name first, then the arguments in two pieces
                args = call["function"]["arguments"]
                head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
                pieces = [head]
                for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                    pieces.append({"index": call["index"], "function": {"arguments": part}})
                for piece in pieces:
                    await asyncio.wait({gone}, timeout=delay)
                    if gone.done():
                        return False
                    writer.write(chunk({"tool_calls": [piece]}))
                    await writer.drain()
                    served.chunks_sent += 1
            end = chunk({}, "tool_calls" if calls else "stop")
            if usage:  # OpenAI's stream_options.include_usage: one more chunk, no choices
                counts = {
                    "prompt_tokens": len(served.prompt.split()),
                    "completion_tokens": len(tokens),
                    "total_tokens": len(served.prompt.split()) + len(tokens),
                }
                last = {"id": f"chatcmpl-{served.number}", "object": "chat.completion.chunk"}
                end += _sse(json.dumps({**last, "model": model, "choices": [], "usage": counts}))
            writer.write(end + _sse("[DONE]") + b"0\r\n\r\n")
            await writer.drain()
            served.completed = time.time()
            log.info("request %d: %d chunks, complete", served.number, served.chunks_sent)
            return True
        except ConnectionError:
            self._mark(served)
            return False
        finally:
            gone.cancel()  # and wait: the next request's read must find the reader free
            await asyncio.gather(gone, return_exceptions=True)
            if served.disconnected is not None:
                log.info(
                    "request %d: client went away after %d chunks",
                    served.number,
                    served.chunks_sent,
                )


def _sse(data: str) -> bytes:
    event = f"data: {data}\n\n".encode()
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed an idle keep-alive connection
    lines = head.decode("latin-1").split("\r\n")
    method, path, version = [*lines[0].split(" "), "", ""][:3]
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > _MAX_BODY:
        raise ConnectionError("request body too large")
    body = await reader.readexactly(length) if length else b""
    keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    return _Request(method, path, headers, body, keep)


async def _error(
    writer: asyncio.StreamWriter, status: int, message: str, code: str, *, headers: str = ""
) -> bool:
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    ).encode()
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Error"
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{headers}\r\n".encode()
        + body
    )
    await writer.drain()
    return True


async def serve(host: str, port: int, token_ms: float, api_key: str | None) -> None:
    """Run until SIGTERM or SIGINT (the CLI's `sessionstream model-server`)."""
    server = ModelServer(host, port, token_ms=token_ms, api_key=api_key)
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    # the demo reads this line for the port (`--port 0` picks a free one)
    log.info("model server listening on %s", server.url)
    try:
        await stop.wait()
    finally:
        await server.close()
