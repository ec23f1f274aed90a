"""The commands a producer sends, under the public import root.

    from sessionstream.client import SessionClient
    from sessionstream.commands import PromptPayload

    client = SessionClient("acme")
    payload = PromptPayload(text="find flights", policy="enqueue")
    handle = client.submit(client.command(client.session_id("s1"), "prompt", payload))

`SessionClient.prompt`, `steer`, `follow_up`, `send`, `abort`, `dequeue` and
`clear_queue` build these for you; the models are here for typing, and for a command built
by hand (`SessionClient.command`).
Fields, defaults and rules: docs/protocol.md#commands. These are the wire contract's own
models (`sessionstream.schemas.commands`), re-exported.
"""

from sessionstream.schemas.commands import (
    PRODUCER_COMMAND_TYPES,
    AbortPayload,
    ClearQueuePayload,
    Command,
    DequeuePayload,
    FollowUpPayload,
    PromptPayload,
    PromptPolicy,
    SendPayload,
    SteerPayload,
)

__all__ = [
    "PRODUCER_COMMAND_TYPES",
    "AbortPayload",
    "ClearQueuePayload",
    "Command",
    "DequeuePayload",
    "FollowUpPayload",
    "PromptPayload",
    "PromptPolicy",
    "SendPayload",
    "SteerPayload",
]
