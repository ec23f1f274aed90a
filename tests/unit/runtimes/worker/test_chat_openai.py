"""The OpenAI-compatible adapter speaks the chat shape: the conversation, the tools as
function definitions and structured output as a json_schema response format go out as the
chat-completions API defines them; tool calls streamed in pieces (`delta.tool_calls[i]`)
come back whole. Against the local model server in this process (loopback, no stack)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel

from sessionstream.apps._model_server import ModelServer
from sessionstream.runtimes.worker._signal import AbortSignal
from sessionstream.runtimes.worker.chat import Message, ToolCall, output_spec, tool
from sessionstream.runtimes.worker.openai_model import OpenAIChatModel, _message


@tool
async def lookup(order: str) -> str:
    """Look an order up."""
    return order


class Verdict(BaseModel):
    ok: bool
    why: str


@pytest.fixture
async def server() -> AsyncIterator[ModelServer]:
    s = ModelServer(token_ms=1)
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def model(server: ModelServer) -> AsyncIterator[OpenAIChatModel]:
    m = OpenAIChatModel(server.url, "m", retries=0)
    yield m
    await m.aclose()


async def test_a_streamed_tool_call_comes_back_whole(
    server: ModelServer, model: OpenAIChatModel
) -> None:
    messages = [Message.system("s").to_json(), Message.user("where is it call=lookup").to_json()]
    deltas: list[str] = []
    reply = await model.chat(
        messages, tools=[lookup.spec.to_json()], signal=AbortSignal(), on_delta=deltas.append
    )
    assert reply.tool_calls == (
        ToolCall("call_1", "lookup", '{"order":"where is it call=lookup"}'),
    )
    assert reply.tool_calls[0].args() == {"order": "where is it call=lookup"}
    assert reply.text == "" and deltas == [] and reply.finish_reason == "tool_calls"
    assert reply.input_tokens is not None  # the usage chunk is still read
    sent = server.served[-1].body
    assert sent["messages"] == messages
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look an order up.",
                "parameters": lookup.spec.parameters,
            },
        }
    ]
    # the call answered: the model is asked again with the whole conversation, and answers
    messages += [
        reply.message().to_json(),
        Message.tool(reply.tool_calls[0], "in transit").to_json(),
    ]
    final = await model.chat(messages, tools=[lookup.spec.to_json()], signal=AbortSignal())
    assert final.tool_calls == () and final.text.startswith("answer[") and " with " in final.text
    assert server.served[-1].body["messages"][2]["tool_calls"][0]["id"] == "call_1"
    assert server.served[-1].body["messages"][3] == {
        "role": "tool",
        "content": "in transit",
        "tool_call_id": "call_1",
    }


async def test_structured_output_is_asked_as_a_json_schema_response_format(
    server: ModelServer, model: OpenAIChatModel
) -> None:
    out = output_spec(Verdict)
    reply = await model.chat(
        [Message.user("judge it").to_json()], output=out.to_json(), signal=AbortSignal()
    )
    assert server.served[-1].body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Verdict", "schema": Verdict.model_json_schema()},
    }
    verdict = out.read(reply.text)
    assert isinstance(verdict, Verdict) and verdict.ok is True


async def test_complete_is_a_chat_of_one_user_message(
    server: ModelServer, model: OpenAIChatModel
) -> None:
    assert await model.complete("hi", signal=AbortSignal()) == (
        await model.chat([{"role": "user", "content": "hi"}], signal=AbortSignal())
    )
    assert server.served[-1].body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in server.served[-1].body
    assert "response_format" not in server.served[-1].body


def test_a_whole_completion_with_tool_calls_is_read() -> None:
    """A server that ignores "stream" answers one JSON body."""
    body = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c9",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    assert _message(body, "http://x") == ("", [ToolCall("c9", "lookup", "{}")], "tool_calls")
