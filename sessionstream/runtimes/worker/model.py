"""The model seam: anything with `complete(prompt, signal=...)` plugs in as the run's LLM.

No network here. A real LLM client implements `Model.complete` (streaming or not) and
stops its HTTP request when `signal` is aborted — typically by racing the request task
against `signal.wait()`, which is what `RunContext.model` does around any Model anyway.
A model that streams may also take `on_delta` (`complete(prompt, signal=..., on_delta=f)`)
and call `f(text)` with each piece of its answer as it arrives: the worker publishes those
as token deltas (`streams_deltas` says whether a model takes them).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from sessionstream.runtimes.worker._signal import AbortSignal

__all__ = ["Completion", "DeltaCallback", "FakeModel", "Model", "streams_deltas"]

#: what a streaming model calls with each piece of its answer
DeltaCallback = Callable[[str], None]


class Completion(str):
    """A model's reply (the text itself: a `str`) with what the provider said about the
    request: the model that answered, tokens in and out, the time to the first token, why
    it stopped, its cost. A `Model` may return one instead of a plain `str`; the worker
    records these on `model.request.finished`."""

    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    first_token_ms: int | None
    finish_reason: str | None
    cost_usd: float | None

    def __new__(
        cls,
        text: str,
        *,
        model: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        first_token_ms: int | None = None,
        finish_reason: str | None = None,
        cost_usd: float | None = None,
    ) -> Completion:
        self = super().__new__(cls, text)
        self.model, self.first_token_ms, self.finish_reason = model, first_token_ms, finish_reason
        self.input_tokens, self.output_tokens, self.cost_usd = input_tokens, output_tokens, cost_usd
        return self


@runtime_checkable
class Model(Protocol):
    """An LLM. `signal` is aborted when the run is cancelled; stop work when it is."""

    name: str

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str: ...


def streams_deltas(model: object) -> bool:
    """Whether `model.complete` takes `on_delta` (by name, or as any keyword)."""
    complete = getattr(model, "complete", None)
    if complete is None:
        return False
    try:
        params = inspect.signature(complete).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "on_delta" or p.kind is p.VAR_KEYWORD for p in params)


class FakeModel:
    """Deterministic: the answer is a digest of the prompt, after `latency_s` (abortable).
    Asked for deltas, it hands out its answer in `pieces` parts over that time."""

    def __init__(self, name: str = "fake-1", latency_s: float = 0.05, pieces: int = 4) -> None:
        self.name = name
        self.latency_s = latency_s
        self.pieces = max(1, pieces)

    async def complete(
        self, prompt: str, *, signal: AbortSignal, on_delta: DeltaCallback | None = None
    ) -> str:
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        answer = f"answer[{digest}] to: {prompt[:80]}"
        if on_delta is None:
            await signal.sleep(self.latency_s)
            signal.raise_if_aborted()
            return answer
        size = -(-len(answer) // self.pieces)
        for i in range(0, len(answer), size):
            await signal.sleep(self.latency_s / self.pieces)
            signal.raise_if_aborted()
            on_delta(answer[i : i + size])
        return answer
