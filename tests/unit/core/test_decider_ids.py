"""Run ids and command digests are part of the log: their fast forms must give exactly the
bytes of their definitions (uuid5; the digest's documented layout), or a replay of an old log
would decide differently and dedup records written before an upgrade would stop matching."""

from __future__ import annotations

import hashlib
import uuid

from hypothesis import given
from hypothesis import strategies as st

from sessionstream.core.decider import RUN_ID_NAMESPACE, command_digest, run_id_for
from sessionstream.schemas.commands import Command, PromptPayload

ids = st.text(min_size=1, max_size=40)


@given(st.text(max_size=300))
def test_run_ids_are_uuid5_of_their_name(name: str) -> None:
    assert run_id_for(name) == str(uuid.uuid5(RUN_ID_NAMESPACE, name))


def _digest_by_definition(c: Command) -> int:
    parts = [
        b"\x00\x1f" if part is None else f"\x01{part}\x1f".encode()
        for part in (c.type, c.tenant_id, c.run_id, c.worker_id, c.generation, c.actor)
    ]
    parts.append(c.payload.__pydantic_serializer__.to_json(c.payload))
    return int.from_bytes(hashlib.blake2b(b"".join(parts), digest_size=8).digest(), "big")


@given(
    tenant=ids,
    run=st.none() | ids,
    worker=st.none() | ids,
    generation=st.none() | st.integers(-(2**53) + 1, 2**53 - 1),
    actor=st.none() | ids,
    text=st.text(max_size=60),
)
def test_the_command_digest_is_its_documented_layout(
    tenant: str,
    run: str | None,
    worker: str | None,
    generation: int | None,
    actor: str | None,
    text: str,
) -> None:
    c = Command.model_construct(
        command_id="c",
        session_id="s",
        tenant_id=tenant,
        type="prompt",
        ts=0,
        run_id=run,
        worker_id=worker,
        generation=generation,
        actor=actor,
        payload=PromptPayload(text=text),
    )
    assert command_digest(c) == _digest_by_definition(c)
