"""The model seam: anything with `complete(prompt, signal=...)` plugs in as the run's LLM.

No network here. A real LLM client implements `Model.complete` (streaming or not) and
stops its HTTP request when `signal` is aborted — typically by racing the request task
against `signal.wait()`, which is what `RunContext.model` does around any Model anyway.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, runtime_checkable

from sessionstream.runtimes.worker._signal import AbortSignal

__all__ = ["Completion", "FakeModel", "Model"]


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


class FakeModel:
    """Deterministic: the answer is a digest of the prompt, after `latency_s` (abortable)."""

    def __init__(self, name: str = "fake-1", latency_s: float = 0.05) -> None:
        self.name = name
        self.latency_s = latency_s

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
        await signal.sleep(self.latency_s)
        signal.raise_if_aborted()
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        return f"answer[{digest}] to: {prompt[:80]}"
