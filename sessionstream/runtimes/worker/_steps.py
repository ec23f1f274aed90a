"""Durable steps on the worker: step ids, the run's recorded results, recording a result.

A run's model calls and tool calls are steps (docs/protocol.md#durable-steps). The book
holds every step recorded for the run that this worker knows of — its own records (across
the run's rounds) and the `step.delivered` events that followed its grant — and numbers the
steps that have no name in call order, so that a new holder making the same calls gets the
same ids and takes the recorded results instead of calling again.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from pydantic import ValidationError

from sessionstream.core.decider import DEFAULT_CONFIG
from sessionstream.schemas.events import StepDelivered

__all__ = ["MAX_STEP_RESULT_BYTES", "RecordedStep", "StepBook", "StepStore"]

log = logging.getLogger("sessionstream.worker")

#: a result held inline in the log (UTF-8 of its JSON); beyond it, a pointer (the decider's)
MAX_STEP_RESULT_BYTES: Final = DEFAULT_CONFIG.max_step_result_bytes

StepKind = Literal["model", "tool"]


class StepStore(Protocol):
    """Object storage for step results over the inline bound: `put` returns a pointer
    (≤ 2048 chars) that `get` reads back."""

    async def put(self, key: str, data: str) -> str: ...

    async def get(self, ref: str) -> str: ...


@dataclass(frozen=True)
class RecordedStep:
    step_id: str
    kind: StepKind
    name: str | None
    #: the result's JSON text, or None when it lives at `result_ref`
    result: str | None
    result_ref: str | None = None
    input_digest: str | None = None


class StepBook:
    """The run's recorded steps as this worker knows them, and its step counters."""

    def __init__(
        self,
        send: Callable[[str, dict[str, Any]], str],
        run_id: str,
        *,
        store: StepStore | None = None,
        max_payload_bytes: int = DEFAULT_CONFIG.max_payload_bytes,
    ) -> None:
        self._send = send
        self.run_id = run_id
        self.store = store
        self.max_payload_bytes = max_payload_bytes
        self.recorded: dict[str, RecordedStep] = {}
        self._models: Iterator[int] = itertools.count(1)
        self._tools: defaultdict[str, Iterator[int]] = defaultdict(lambda: itertools.count(1))
        #: how many `step.delivered` the grant announced, and how many came
        self.expected = 0
        self.delivered = 0
        self.all_delivered = asyncio.Event()
        self.all_delivered.set()

    # -- ids ----------
    def begin_round(self) -> None:
        """The handler is called (again) from its start: call order counts from 1, so the
        calls an earlier round made come back with the ids they were recorded under."""
        self._models = itertools.count(1)
        self._tools.clear()

    def model_step(self, step: str | None) -> str:
        return step if step is not None else f"model-{next(self._models)}"

    def tool_step(self, name: str, step: str | None) -> str:
        return step if step is not None else f"tool:{name}-{next(self._tools[name])}"

    @staticmethod
    def digest(given: Any) -> tuple[str, str]:
        """(the input's JSON text, its digest)."""
        try:
            text = json.dumps(given, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError):
            text = json.dumps(repr(given))
        return text, "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def lookup(self, step_id: str, digest: str) -> tuple[str, RecordedStep | None]:
        """(the id this call is recorded under, its record if any). A record under the id
        whose input was another is another call (an earlier round's, or a handler whose
        calls depend on something else): this one is its own step, `{id}~{digest}`."""
        rec = self.recorded.get(step_id)
        if rec is None or rec.input_digest in (None, digest):
            return step_id, rec
        alt = f"{step_id}~{digest[7:19]}"
        return alt, self.recorded.get(alt)

    def idempotency_id(self, step_id: str) -> str:
        """The same on every attempt of the step, on every holder."""
        return f"{self.run_id}/{step_id}"

    # -- what the grant hands over ----------
    def expect(self, n: int) -> None:
        self.expected = n
        if self.delivered < n:
            self.all_delivered.clear()

    def deliver(self, d: StepDelivered) -> None:
        self.recorded.setdefault(
            d.step_id,
            RecordedStep(d.step_id, d.kind, d.name, d.result, d.result_ref, d.input_digest),
        )
        self.delivered += 1
        if self.delivered >= self.expected:
            self.all_delivered.set()

    # -- looking up, recording ----------
    def get(self, step_id: str) -> RecordedStep | None:
        return self.recorded.get(step_id)

    async def value(self, rec: RecordedStep) -> Any:
        """The recorded result, as the call returned it."""
        text = rec.result
        if text is None and rec.result_ref is not None:
            if self.store is None:
                raise RuntimeError(f"step {rec.step_id} is stored at {rec.result_ref}: no store")
            text = await self.store.get(rec.result_ref)
        return None if text is None else json.loads(text)

    async def record(
        self, step_id: str, kind: StepKind, name: str | None, given: Any, value: Any
    ) -> None:
        """Record a finished step's result: inline, or by pointer beyond the bound. A step
        that cannot be recorded is logged and stays local (it runs again elsewhere)."""
        try:
            result: str | None = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as e:
            log.warning(
                "step %s of run %s: result not JSON, not recorded: %s", step_id, self.run_id, e
            )
            return
        input_text, digest = self.digest(given)
        ref: str | None = None
        assert result is not None
        if len(result.encode()) > MAX_STEP_RESULT_BYTES:
            if self.store is None:
                log.warning(
                    "step %s of run %s: %s bytes of result > %s and no step store: not durable",
                    step_id,
                    self.run_id,
                    len(result.encode()),
                    MAX_STEP_RESULT_BYTES,
                )
                self.recorded[step_id] = RecordedStep(step_id, kind, name, result, None, digest)
                return
            try:
                ref = await self.store.put(self.idempotency_id(step_id), result)
            except Exception as e:  # the store is down: the step stays local, as without one
                log.warning(
                    "step %s of run %s: not stored (%s): not durable", step_id, self.run_id, e
                )
                self.recorded[step_id] = RecordedStep(step_id, kind, name, result, None, digest)
                return
            result = None
        payload: dict[str, Any] = {
            "stepId": step_id,
            "kind": kind,
            "name": name,
            "inputDigest": digest,
            "input": input_text,
            "result": result,
            "resultRef": ref,
        }
        size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
        if size > self.max_payload_bytes:
            payload["input"] = None  # the digest says what it was; the log keeps the rest
        self.recorded[step_id] = RecordedStep(step_id, kind, name, result, ref, digest)
        try:
            self._send("step.record", payload)
        except ValidationError as e:
            log.warning("step %s of run %s: not recorded: %s", step_id, self.run_id, e)
